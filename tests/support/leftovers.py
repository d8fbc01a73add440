"""What the test suite leaves behind: nothing running, and the user's Prefect homes untouched.

A pytest plugin (``tests/conftest.py`` loads it):

- As it is imported it makes pytest the subreaper of what it starts and notes what
  already runs below pytest (``support.processes``): every process the suite starts
  stays below it, however it was started (an environment of its own, a session of its
  own, a parent killed), and what was there before (a server the user's shell started
  and then ``exec``'d pytest) is not the suite's.
- Before anything imports Prefect it refuses to run where Prefect would read the user's
  settings from a file in the working folder (``.env``, ``prefect.toml``,
  ``pyproject.toml``'s ``[tool.prefect]``: they outrank any profile, and would point the
  suite at the user's server), notes what is in the user's Prefect homes (``~/.prefect``
  and ``PREFECT_HOME`` as it was), takes the user's Prefect settings out of the
  environment (in any case: Prefect reads ``prefect_api_url`` too) and points
  ``PREFECT_HOME`` at a fresh folder of the suite's own (the ``prefect_home`` fixture).
- At each test's phase it looks below pytest: a process first seen there is that
  phase's; an adopted orphan that exited is reaped.
- Last of all, once every plugin's ``pytest_unconfigure`` ran (a conftest may stop its
  own service there), a process the suite started that still runs is named with the
  test that started it and its ``PREFECT_HOME``, and stopped by its PID; a change to a
  user's Prefect home is listed. Either fails the run. SIGTERM (a CI job cancelled, a
  ``timeout``) ends the run as Ctrl-C does, with this sweep; Ctrl-C during the sweep is
  ignored.

A process the suite did not start (the user's own server among them) is not below it,
and is neither reported nor stopped. A pytest run inside the suite (``SESSION_VARIABLE``
set) leaves all of this to the outer one.
"""

from __future__ import annotations

import contextlib
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
_SESSION = pytest.StashKey[pytest.Session]()
_SIGTERM = pytest.StashKey[Any]()

#: The user's Prefect homes, as they were before the suite (``is_users_prefect_home``).
_user_homes: list[Path] = []


class _Before:
    """What ran below this process before the plugin was imported, and since when the
    suite's processes count; set up as the plugin is imported (before the conftests that
    follow it, which may start processes), unless a run of the suite is already on."""

    def __init__(self) -> None:
        self.active = SESSION_VARIABLE not in os.environ
        self.since = processes.now()
        self.spawns = processes.Spawns()
        self.there: set[tuple[int, int]] = set()
        self.groups: set[int] = set()
        if self.active:
            processes.become_subreaper()
            self.spawns.start()
            self.there = {(p.pid, p.started) for p in processes.subtree(os.getpid())}

    def is_before(self, p: processes.Process) -> bool:
        return (p.pid, p.started) in self.there or p.started < self.since

    def note_groups(self, below: list[processes.Process]) -> None:
        """The process groups of their own that the run's processes made (a process that
        forks faster than /proc is read is still in its group)."""
        own = os.getpgrp()
        self.groups |= {p.group for p in below if p.group != own and not self.is_before(p)}


_before = _Before()


def marks() -> dict[str, str]:
    """The variables that mark a process as started inside this run (for an environment
    built anew): a pytest it starts leaves the sweep to this one."""
    return {k: os.environ[k] for k in (SESSION_VARIABLE,) if k in os.environ}


def is_prefect_setting(name: str) -> bool:
    """Prefect reads its settings from the environment in any case."""
    return name.upper().startswith("PREFECT_")


def is_users_prefect_home(home: Path) -> bool:
    """``home`` is the user's own Prefect home: ``~/.prefect``, or ``PREFECT_HOME`` as it
    was before the suite."""
    mine = {os.path.realpath(h) for h in [Path.home() / ".prefect", *_user_homes]}
    return os.path.realpath(Path(home).expanduser()) in mine


def _own_helpers() -> set[int]:
    """The helpers this process's multiprocessing and joblib's loky started (a resource
    tracker, a forkserver, loky's reusable workers), which end with it: not left
    behind. By PID, not by command line: an orphaned helper of another process moves
    under this one too, and is not its."""
    pids: set[Any] = {
        getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None),
        getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None),
    }
    tracker = sys.modules.get("joblib.externals.loky.backend.resource_tracker")
    if tracker is not None:
        pids.add(getattr(getattr(tracker, "_resource_tracker", None), "_pid", None))
    reusable = sys.modules.get("joblib.externals.loky.reusable_executor")
    executor = getattr(reusable, "_executor", None)
    pids |= set(getattr(executor, "_processes", None) or {})
    return {pid for pid in pids if pid}


def left_behind() -> list[processes.Process]:
    """What this run started and still runs, at any depth, but this process's helpers."""
    root, helpers = os.getpid(), _own_helpers()
    below = {p.pid: p for p in processes.subtree(root)}
    _before.spawns.reap_adopted(list(below.values()), root)  # a process forking fast leaves many
    _before.note_groups(list(below.values()))
    below.update((p.pid, p) for p in processes.descendants(root, processes.table()))
    return [
        p
        for p in below.values()
        if p.state != "Z" and p.pid not in helpers and not _before.is_before(p)
    ]


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


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    global _user_homes
    if not _before.active:  # inside a run of the suite: the outer run sweeps
        return
    _refuse_the_users_settings(config)
    user_env = {k: v for k, v in os.environ.items() if is_prefect_setting(k)}
    config.stash[_USER_PREFECT_ENV] = user_env
    _user_homes = user_homes({k.upper(): v for k, v in user_env.items()})
    config.stash[_USER_HOMES_BEFORE] = {home: snapshot(home) for home in _user_homes}
    for k in user_env:  # the user's server and profile are not the suite's
        del os.environ[k]
    suite_home = Path(tempfile.mkdtemp(prefix="popflow-suite-prefect-home-"))
    config.stash[_SUITE_HOME] = suite_home
    os.environ["PREFECT_HOME"] = str(suite_home)
    os.environ[SESSION_VARIABLE] = uuid.uuid4().hex
    config.stash[_TIMELINE] = processes.Timeline(
        "the session's start (before any test)", os.getpid()
    )
    # a cancelled CI job or a `timeout` sends SIGTERM: end as Ctrl-C does, sweeping first
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        config.stash[_SIGTERM] = signal.signal(signal.SIGTERM, _interrupt)


def suite_prefect_home(config: pytest.Config) -> Path:
    """The Prefect home of the suite's own (``PREFECT_HOME`` during the run)."""
    return config.stash[_SUITE_HOME]


def pytest_report_header(config: pytest.Config) -> str | None:
    if _SUITE_HOME not in config.stash:
        return None
    return f"popflow: PREFECT_HOME={config.stash[_SUITE_HOME]} (the suite's own)"


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_SESSION] = session


def _mark(config: pytest.Config, what: str) -> None:
    if _TIMELINE in config.stash:
        below = config.stash[_TIMELINE].mark(what)
        _before.spawns.reap_adopted(below, os.getpid())
        _before.note_groups(below)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _mark(item.config, f"{item.nodeid} (setup)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    _mark(item.config, f"{item.nodeid} (call)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    _mark(item.config, f"{item.nodeid} (teardown)")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    _mark(session.config, "the session's end (its fixtures' teardown)")


@contextlib.contextmanager
def _uninterrupted() -> Iterator[None]:
    """Ctrl-C (and SIGTERM) wait while the sweep runs: a second Ctrl-C once left the
    processes it was stopping running."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


@pytest.hookimpl(trylast=True)  # after every other plugin's, which may stop their services
def pytest_unconfigure(config: pytest.Config) -> None:
    if _SUITE_HOME not in config.stash:
        return
    try:
        with _uninterrupted():
            lines = _left_processes(config) + _changed_homes(config)
        if lines:
            _report(config, lines)
    finally:
        shutil.rmtree(config.stash[_SUITE_HOME], ignore_errors=True)
        os.environ.pop(SESSION_VARIABLE, None)
        os.environ.pop("PREFECT_HOME", None)
        os.environ.update(config.stash[_USER_PREFECT_ENV])
        if _SIGTERM in config.stash:
            signal.signal(signal.SIGTERM, config.stash[_SIGTERM])


def _report(config: pytest.Config, lines: list[str]) -> None:
    """``lines`` in red under a heading, and the run fails (pytest returns the session's
    exit status after the plugins' ``pytest_unconfigure``)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", "popflow: what the suite left behind", red=True, bold=True)
        for line in lines:
            reporter.write_line(line, red=True)
    else:
        print("\n".join(lines), file=sys.stderr)
    session = config.stash.get(_SESSION, None)
    if session is not None and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _left_processes(config: pytest.Config) -> list[str]:
    """One line for each process the run left running, which is stopped then."""
    if not os.path.isdir("/proc"):
        return []
    found = {p.pid: p for p in _still_running()}
    for group in _before.groups:  # what forks faster than /proc is read, listed stopped
        found.update((p.pid, p) for p in processes.members(group))
    if not (left := list(found.values())):
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
            f"  {p.kind}, pid {p.pid}, started during {timeline.started_during(p, said)}, "
            f"PREFECT_HOME={home}: {p.cmdline[:200]}"
        )
    processes.stop(left_behind, STOP_TIMEOUT_S, _before.groups)
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
