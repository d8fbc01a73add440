"""A run of the suite leaves nothing behind (issue 48): a script never falls back to the
user's ``~/.prefect``, and a run that leaves a process running or changes the user's
Prefect home fails, naming the test, with the process stopped by its PID
(tests/support/leftovers.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support import leftovers
from support.scripts import embedded_env

pytest_plugins = ["pytester"]

TESTS = str(Path(__file__).resolve().parent)


@pytest.mark.unit
@pytest.mark.parametrize("home", [None, ""])
def test_a_script_without_a_prefect_home_is_refused(home):
    with pytest.raises(ValueError, match="needs a Prefect home"):
        embedded_env(home)


@pytest.mark.unit
def test_a_script_in_the_users_own_prefect_home_is_refused():
    with pytest.raises(ValueError, match="the user's own Prefect home"):
        embedded_env(Path.home() / ".prefect")
    with pytest.raises(ValueError, match="the user's own Prefect home"):
        embedded_env("~/.prefect")


@pytest.mark.unit
def test_a_scripts_environment_has_its_home_and_the_runs_mark_and_no_other_prefect_setting(
    tmp_path,
):
    bare = {"PATH": "/bin", "PREFECT_API_URL": "http://127.0.0.1:4200/api", "PREFECT_HOME": "x"}
    env = embedded_env(tmp_path, bare)
    assert env == {
        "PATH": "/bin",
        "PREFECT_HOME": str(tmp_path),
        leftovers.SESSION_VARIABLE: os.environ[leftovers.SESSION_VARIABLE],
    }


@pytest.mark.unit
def test_the_suite_runs_in_a_prefect_home_of_its_own(prefect_home):
    assert os.environ["PREFECT_HOME"] == prefect_home
    assert not leftovers.is_users_prefect_home(Path(prefect_home))


@pytest.mark.unit
def test_a_file_written_added_or_removed_in_a_prefect_home_is_a_change(tmp_path):
    home = tmp_path / ".prefect"
    assert leftovers.changes(None, leftovers.snapshot(home)) == []
    home.mkdir()
    (home / "prefect.db").write_text("runs")
    (home / "profiles.toml").write_text("")
    before = leftovers.snapshot(home)
    assert leftovers.changes(before, leftovers.snapshot(home)) == []
    (home / "prefect.db").write_text("runs and the suite's")
    (home / "profiles.toml").unlink()
    (home / "storage").mkdir()
    assert leftovers.changes(before, leftovers.snapshot(home)) == [
        "added storage",
        "removed profiles.toml",
        "changed prefect.db",
    ]
    assert leftovers.changes(None, before) == [
        "created (it did not exist)",
        "added prefect.db",
        "added profiles.toml",
    ]


#: A test that does what the old ``embedded_env()`` did: a script with no ``PREFECT_`` settings
#: (no ``PREFECT_HOME``) starts popflow's local server in ``~/.prefect`` and leaves it.
LEAKING = textwrap.dedent(
    """
    import os, subprocess, sys

    def test_a_script_on_the_users_home():
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        code = "from popflow.infra import local_server; print(local_server.local_server().pid)"
        out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                             capture_output=True, text=True).stdout
        with open("server.pid", "w") as f:
            f.write(out.split()[-1])
    """
)

#: A test that starts a process and stops it, and one that starts multiprocessing's resource
#: tracker (as a Dask cluster does), which lives as long as pytest does.
TIDY = textwrap.dedent(
    """
    import multiprocessing, subprocess, sys

    def test_a_process_started_and_stopped():
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        proc.kill()
        proc.wait()

    def test_a_lock_shared_with_spawned_processes():
        global LOCK
        LOCK = multiprocessing.get_context("spawn").Lock()
    """
)


def inner_run(pytester: pytest.Pytester, monkeypatch, test: str, home: Path):
    """``test`` run by a pytest of its own with the leftovers plugin, as a user whose home is
    ``home`` (no ``PREFECT_HOME`` of theirs)."""
    pytester.makepyfile(test_inner=test)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("PREFECT_HOME")
    monkeypatch.setenv("PYTHONPATH", TESTS)
    return pytester.runpytest_subprocess("-p", "support.leftovers", "-p", "no:cacheprovider")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.system
def test_a_run_that_leaves_a_server_in_the_users_home_fails_naming_the_test_and_stops_it(
    pytester, monkeypatch, tmp_path
):
    # a process of the user's own (not the run's: no mark) that the sweep must leave alone
    env = {k: v for k, v in os.environ.items() if k != leftovers.SESSION_VARIABLE}
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env)
    try:
        home = tmp_path / "user"
        home.mkdir()
        result = inner_run(pytester, monkeypatch, LEAKING, home)
        out = result.stdout.str()
        assert result.ret == pytest.ExitCode.TESTS_FAILED, out
        result.stdout.fnmatch_lines(
            [
                "*the suite left 1 process(es) running*",
                "*a Prefect server, pid *, started during "
                "test_inner.py::test_a_script_on_the_users_home (call), "
                f"PREFECT_HOME={home / '.prefect'} (the user's own)*",
                f"*the suite changed the user's Prefect home {home / '.prefect'}*",
                "*created (it did not exist)*",
            ]
        )
        pid = int((pytester.path / "server.pid").read_text())
        assert not alive(pid), f"the server {pid} still runs"
        assert alive(bystander.pid), "the sweep stopped a process the run did not start"
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.system
def test_a_run_that_stops_what_it_starts_passes(pytester, monkeypatch, tmp_path):
    home = tmp_path / "user"
    (home / ".prefect").mkdir(parents=True)
    (home / ".prefect" / "prefect.db").write_text("the user's runs")
    result = inner_run(pytester, monkeypatch, TIDY, home)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert "what the suite left behind" not in result.stdout.str()
    assert (home / ".prefect" / "prefect.db").read_text() == "the user's runs"
