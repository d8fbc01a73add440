"""The test tiers hold: a test with no tier or two fails collection, and a ``unit`` test
that opens a socket or starts a process fails, saying why (tests/support/tiers.py)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit

pytest_plugins = ["pytester"]

MARKERS = """
[pytest]
markers =
    unit: u
    integration: i
    system: s
"""


@pytest.fixture
def inner(
    pytester: pytest.Pytester, _unit_tests_stay_inside: pytest.MonkeyPatch
) -> pytest.Pytester:
    """A pytest session of its own with the tiers plugin; this test's own guard is lifted,
    so what refuses the inner test's socket is the inner session's plugin."""
    _unit_tests_stay_inside.undo()
    pytester.makeini(MARKERS)
    return pytester


def run(pytester: pytest.Pytester) -> pytest.RunResult:
    return pytester.runpytest_inprocess("-p", "support.tiers", "-p", "no:cacheprovider")


def test_a_unit_test_that_opens_a_socket_fails_saying_why(inner: pytest.Pytester) -> None:
    inner.makepyfile(
        """
        import socket, pytest

        @pytest.mark.unit
        def test_reaches_out():
            with socket.socket() as s:
                s.connect(("127.0.0.1", 9))
        """
    )
    result = run(inner)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*NotAUnitTest: a `unit` test must not connect a socket*"])


def test_a_unit_test_that_starts_a_process_fails_saying_why(inner: pytest.Pytester) -> None:
    inner.makepyfile(
        """
        import subprocess, sys, pytest

        @pytest.mark.unit
        def test_starts_one():
            subprocess.run([sys.executable, "-c", "pass"], check=True)
        """
    )
    result = run(inner)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*NotAUnitTest: a `unit` test must not start a subprocess*"])


@pytest.mark.parametrize(
    ("marks", "said"),
    [("", "no tier"), ("@pytest.mark.unit\n@pytest.mark.system\n", "system, unit")],
)
def test_a_test_with_no_tier_or_two_fails_collection(
    inner: pytest.Pytester, marks: str, said: str
) -> None:
    inner.makepyfile(
        f"import pytest\n\n@pytest.mark.integration\ndef test_ok():\n    pass\n\n{marks}def test_x():\n    pass\n"
    )
    result = run(inner)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*test_x: {said}*"])


def test_a_test_with_one_tier_runs(inner: pytest.Pytester) -> None:
    inner.makepyfile("import pytest\n\npytestmark = pytest.mark.unit\n\ndef test_x():\n    pass\n")
    run(inner).assert_outcomes(passed=1)
