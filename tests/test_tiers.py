"""The test tiers hold: a test with no tier or two fails collection, and a ``unit`` test
that opens a socket or starts a process fails, saying why (tests/support/tiers.py). Each
case runs in a pytest session of its own, in a process of its own."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.inner_pytest import run_pytest, write_tests

pytestmark = pytest.mark.integration


def run(folder: Path, source: str) -> pytest.RunResult:
    write_tests(folder, test_inner=source)
    return run_pytest(folder, "-p", "support.tiers")


def test_a_unit_test_that_opens_a_socket_fails_saying_why(tmp_path: Path) -> None:
    source = """
        import socket, pytest

        @pytest.mark.unit
        def test_reaches_out():
            with socket.socket() as s:
                s.connect(("127.0.0.1", 9))
        """
    result = run(tmp_path, source)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*NotAUnitTest: a `unit` test must not connect a socket*"])


def test_a_unit_test_that_starts_a_process_fails_saying_why(tmp_path: Path) -> None:
    source = """
        import subprocess, sys, pytest

        @pytest.mark.unit
        def test_starts_one():
            subprocess.run([sys.executable, "-c", "pass"], check=True)
        """
    result = run(tmp_path, source)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*NotAUnitTest: a `unit` test must not start a subprocess*"])


@pytest.mark.parametrize(
    ("marks", "said"),
    [("", "no tier"), ("@pytest.mark.unit\n@pytest.mark.system\n", "system, unit")],
)
def test_a_test_with_no_tier_or_two_fails_collection(tmp_path: Path, marks: str, said: str) -> None:
    source = f"import pytest\n\n@pytest.mark.integration\ndef test_ok():\n    pass\n\n{marks}def test_x():\n    pass\n"
    result = run(tmp_path, source)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*test_x: {said}*"])


def test_a_test_with_one_tier_runs(tmp_path: Path) -> None:
    source = "import pytest\n\npytestmark = pytest.mark.unit\n\ndef test_x():\n    pass\n"
    run(tmp_path, source).assert_outcomes(passed=1)
