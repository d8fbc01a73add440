"""What the test suite leaves behind: nothing running, and the user's Prefect homes untouched.

A pytest plugin (``tests/conftest.py`` loads it):

- Before anything imports Prefect it refuses to run where Prefect would read the user's
  settings from a file in the working folder (``.env``, ``prefect.toml``,
  ``pyproject.toml``'s ``[tool.prefect]``: they outrank any profile, and would point the
  suite at the user's server), notes what is in the user's Prefect homes (``~/.prefect``
  and ``PREFECT_HOME`` as it was), takes the user's ``PREFECT_`` settings out of the
  environment and points ``PREFECT_HOME`` at a fresh folder of the suite's own (the
  ``prefect_home`` fixture).
- It makes this process the subreaper of what it starts (``support.processes``): every
  process the suite starts stays below it, however it was started (its own environment,
  a session of its own, a parent killed), and a timeline of the tests says which test
  was running when each started.
- At the end of the run, after every fixture is torn down, a process below it that still
  runs is named with the test that started it and its ``PREFECT_HOME``, and stopped by
  its PID; a change to a user's Prefect home is listed. Either fails the run.

A process the suite did not start (the user's own server among them) is not below it,
and is neither reported nor stopped. A pytest run inside the suite (``SESSION_VARIABLE``
set) leaves all of this to the outer one.
"""

from __future__ import annotations

import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from support import processes
from support.prefect_homes import changes, settings_files, snapshot, user_homes

#: Set while a run of the suite goes on: a pytest started inside it (in its process or
#: not) leaves the sweep and the homes to the outer run.
SESSION_VARIABLE = "POPFLOW_TEST_SESSION"
#: Seconds a process the suite started may take to finish exiting once the run ends
#: (a server stopped by the last fixture), and to exit once the sweep stops it.
EXIT_GRACE_S = 10.0
STOP_TIMEOUT_S = 30.0

_SUITE_HOME = pytest.StashKey[Path]()
_USER_HOMES_BEFORE = pytest.StashKey["dict[Path, dict | None]"]()
_USER_PREFECT_ENV = pytest.StashKey["dict[str, str]"]()
_TIMELINE = pytest.StashKey[processes.Timeline]()

#: The user's Prefect homes, as they were before the suite (``is_users_prefect_home``).
_user_homes: list[Path] = []


def marks() -> dict[str, str]:
    """The variables that mark a process as started inside this run (for an environment
    built anew): a pytest it starts leaves the sweep to this one."""
    return {k: os.environ[k] for k in (SESSION_VARIABLE,) if k in os.environ}


def is_users_prefect_home(home: Path) -> bool:
    """``home`` is the user's own Prefect home: ``~/.prefect``, or ``PREFECT_HOME`` as it
    was before the suite."""
    mine = {os.path.realpath(h) for h in [Path.home() / ".prefect", *_user_homes]}
    return os.path.realpath(Path(home).expanduser()) in mine


def _own_helpers() -> set[int]:
    """The helpers this process's multiprocessing (and joblib's loky) started, which exit
    when it does: not left behind. By PID, not by command line: an orphaned helper of
    another process moves under this one too, and is not its."""
    pids = {
        getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None),
        getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None),
    }
    loky = sys.modules.get("joblib.externals.loky.backend.resource_tracker")
    if loky is not None:
        pids.add(getattr(getattr(loky, "_resource_tracker", None), "_pid", None))
    return {pid for pid in pids if pid}


def left_behind() -> list[processes.Process]:
    """What this run started and still runs, at any depth, but this process's helpers."""
    helpers = _own_helpers()
    below = processes.descendants(os.getpid(), processes.table())
    return [p for p in below if p.pid not in helpers]


def _still_running() -> list[processes.Process]:
    """This run's processes still running at its end, after those in the middle of
    exiting (a server the last fixture stopped) were given ``EXIT_GRACE_S`` to finish."""
    deadline = time.monotonic() + EXIT_GRACE_S
    while (found := processes.looks(left_behind)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def _refuse_the_users_settings(config: pytest.Config) -> None:
    folders = dict.fromkeys([Path.cwd(), config.rootpath, config.rootpath / "tests"])
    found = [f for folder in folders for f in settings_files(folder)]
    if found:
        raise pytest.UsageError(
            "Prefect reads settings from these files in the folders the suite runs in, "
            "ahead of any profile, and they would point the suite at your own Prefect "
            "server or database:\n  " + "\n  ".join(found) + "\nmove them aside while "
            "the suite runs (for example `mv .env .env.aside`)"
        )


def pytest_configure(config: pytest.Config) -> None:
    global _user_homes
    if SESSION_VARIABLE in os.environ:  # inside a run of the suite: the outer run sweeps
        return
    _refuse_the_users_settings(config)
    user_env = {k: v for k, v in os.environ.items() if k.startswith("PREFECT_")}
    config.stash[_USER_PREFECT_ENV] = user_env
    _user_homes = user_homes(user_env)
    config.stash[_USER_HOMES_BEFORE] = {home: snapshot(home) for home in _user_homes}
    for k in user_env:  # the user's server and profile are not the suite's
        del os.environ[k]
    suite_home = Path(tempfile.mkdtemp(prefix="popflow-suite-prefect-home-"))
    config.stash[_SUITE_HOME] = suite_home
    os.environ["PREFECT_HOME"] = str(suite_home)
    os.environ[SESSION_VARIABLE] = uuid.uuid4().hex
    processes.become_subreaper()
    config.stash[_TIMELINE] = processes.Timeline("the session's start (before any test)")


def suite_prefect_home(config: pytest.Config) -> Path:
    """The Prefect home of the suite's own (``PREFECT_HOME`` during the run)."""
    return config.stash[_SUITE_HOME]


def pytest_report_header(config: pytest.Config) -> str | None:
    if _SUITE_HOME not in config.stash:
        return None
    return f"popflow: PREFECT_HOME={config.stash[_SUITE_HOME]} (the suite's own)"


def _mark(item: pytest.Item, phase: str) -> None:
    if _TIMELINE in item.config.stash:
        item.config.stash[_TIMELINE].mark(f"{item.nodeid} ({phase})")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _mark(item, "setup")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    _mark(item, "call")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    _mark(item, "teardown")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    if _TIMELINE in session.config.stash:  # before pytest's own hook tears fixtures down
        session.config.stash[_TIMELINE].mark("the session's end (its fixtures' teardown)")


@pytest.hookimpl(trylast=True, specname="pytest_sessionfinish")
def pytest_sessionfinish_check(session: pytest.Session) -> None:
    """After pytest's own ``pytest_sessionfinish``, which tears the fixtures down, and
    before the summary: what was left fails the run."""
    config = session.config
    if _SUITE_HOME not in config.stash:
        return
    lines = _left_processes(config) + _changed_homes(config)
    if not lines:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", "popflow: what the suite left behind", red=True, bold=True)
        for line in lines:
            reporter.write_line(line, red=True)
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _left_processes(config: pytest.Config) -> list[str]:
    """One line for each process the run left running, which is stopped then."""
    left = _still_running() if os.path.isdir("/proc") else []
    if not left:
        return []
    timeline = config.stash[_TIMELINE]
    lines = [f"the suite left {len(left)} process(es) running (stopped now, by their PIDs):"]
    for p in sorted(left, key=lambda p: p.started):
        env = processes.environment(p.pid)
        said = None if env is None else env.get("PYTEST_CURRENT_TEST")
        if env is None:
            home = "unknown (its environment cannot be read)"
        elif "PREFECT_HOME" in env:
            home = env["PREFECT_HOME"]
            home += " (the user's own)" if is_users_prefect_home(Path(home)) else ""
        else:
            home = "unset: ~/.prefect (the user's own)"
        lines.append(
            f"  {p.kind}, pid {p.pid}, started during {timeline.during(p.started, said)}, "
            f"PREFECT_HOME={home}: {p.cmdline[:200]}"
        )
    processes.stop(left_behind, STOP_TIMEOUT_S)
    return lines


def _changed_homes(config: pytest.Config) -> list[str]:
    lines = []
    for home, before in config.stash[_USER_HOMES_BEFORE].items():
        changed = changes(before, snapshot(home))
        if changed:
            lines.append(
                f"the suite changed the user's Prefect home {home} "
                "(or something else did while it ran: a Prefect server of the user's own):"
            )
            lines += [f"  {line}" for line in changed[:40]]
            if len(changed) > 40:
                lines.append(f"  ... and {len(changed) - 40} more")
    return lines


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SUITE_HOME not in config.stash:
        return
    shutil.rmtree(config.stash[_SUITE_HOME], ignore_errors=True)
    os.environ.pop(SESSION_VARIABLE, None)
    os.environ.pop("PREFECT_HOME", None)
    os.environ.update(config.stash[_USER_PREFECT_ENV])
