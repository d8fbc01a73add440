"""What the test suite leaves behind: nothing running, and the user's Prefect home untouched.

A pytest plugin (``tests/conftest.py`` loads it):

- Before anything imports Prefect it notes the user's Prefect home (``PREFECT_HOME`` as it
  was, else ``~/.prefect``) and what is in it, takes the user's ``PREFECT_`` settings out of
  the environment (their server, their profile) and points ``PREFECT_HOME`` at a fresh
  folder of the suite's own (the ``prefect_home`` fixture).
- It marks this process's environment with a token of this run (``SESSION_VARIABLE``).
  Every process the suite starts inherits it, beside pytest's ``PYTEST_CURRENT_TEST`` (the
  test that was running): that is the record of what the suite started, with its PID, read
  from ``/proc/<pid>/environ`` however deep the process and whatever session it started.
- At the end of the run, after every fixture is torn down, a process that carries the
  token and still runs (a Prefect server, a Dask worker, ...) is named with the test that
  started it and its ``PREFECT_HOME``, and stopped by its PID; a change to the user's
  Prefect home is listed. Either fails the run.

A process the suite did not start (the user's own server among them) carries no token,
and is neither reported nor stopped.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

#: The variable that marks the processes of one run of the suite.
SESSION_VARIABLE = "POPFLOW_TEST_SESSION"
#: Seconds a process the suite started may take to finish exiting once the run ends
#: (a server stopped by the last fixture), and to exit once the sweep stops it.
EXIT_GRACE_S = 10.0
STOP_TIMEOUT_S = 30.0
#: The helpers Python's multiprocessing (and joblib's loky) start beside the process that
#: uses them, ending when it does: this process's own are not left behind.
HELPERS = ("resource_tracker import main", "forkserver import main")

_SUITE_HOME = pytest.StashKey[Path]()
_USER_HOME = pytest.StashKey[Path]()
_USER_HOME_BEFORE = pytest.StashKey["dict[str, tuple[int, int]] | None"]()
_USER_PREFECT_ENV = pytest.StashKey["dict[str, str]"]()

#: The user's Prefect home, as it was before the suite (``is_users_prefect_home``).
_user_home: Path | None = None


@dataclass(frozen=True)
class Started:
    """A process that carries this run's token: what it runs and who started it."""

    pid: int
    cmdline: str
    test: str  # PYTEST_CURRENT_TEST when it started
    home: str  # its PREFECT_HOME
    session_leader: bool  # started its own session: its process group is the suite's too
    parent: int

    @property
    def kind(self) -> str:
        if "prefect" in self.cmdline and " server" in self.cmdline:
            return "a Prefect server"
        if "distributed" in self.cmdline or "dask" in self.cmdline:
            return "a Dask process"
        return "a process"

    @property
    def ends_with_this_process(self) -> bool:
        """A helper of this process's multiprocessing, which exits when this one does."""
        return self.parent == os.getpid() and any(h in self.cmdline for h in HELPERS)


def marks() -> dict[str, str]:
    """The variables that mark a process as this run's (for an environment built anew)."""
    return {k: os.environ[k] for k in (SESSION_VARIABLE,) if k in os.environ}


def users_prefect_home() -> Path:
    """The user's Prefect home as it was before the suite (``~/.prefect`` outside one)."""
    return _user_home or Path.home() / ".prefect"


def is_users_prefect_home(home: Path) -> bool:
    """``home`` is the user's own Prefect home: ``~/.prefect``, or ``PREFECT_HOME`` as it
    was before the suite."""
    mine = {(Path.home() / ".prefect").resolve(), users_prefect_home().resolve()}
    return Path(home).expanduser().resolve() in mine


def snapshot(folder: Path) -> dict[str, tuple[int, int]] | None:
    """Every file and folder under ``folder``: its size and modification time (``None``
    if ``folder`` does not exist). Links are listed, not followed."""
    if not folder.exists():
        return None
    out: dict[str, tuple[int, int]] = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            with contextlib.suppress(OSError):  # gone since it was listed
                st = os.lstat(path)
                is_dir = os.path.isdir(path) and not os.path.islink(path)
                # a folder's own time changes as it is listed into; its entries say what changed
                out[os.path.relpath(path, folder)] = (
                    (-1, 0) if is_dir else (st.st_size, st.st_mtime_ns)
                )
    return out


def changes(
    before: dict[str, tuple[int, int]] | None, after: dict[str, tuple[int, int]] | None
) -> list[str]:
    """What differs between two snapshots of a folder, one line each."""
    if before == after:
        return []
    if before is None:
        return ["created (it did not exist)"] + [f"added {p}" for p in sorted(after or {})]
    if after is None:
        return ["removed (it existed)"]
    return (
        [f"added {p}" for p in sorted(after.keys() - before.keys())]
        + [f"removed {p}" for p in sorted(before.keys() - after.keys())]
        + [f"changed {p}" for p in sorted(before.keys() & after.keys()) if before[p] != after[p]]
    )


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = f.read().split(b"\0")
    return dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)


def started(token: str) -> list[Started]:
    """The running processes (not zombies) whose environment carries ``token``, but this
    one: the processes this run started, at any depth."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        try:  # gone since listed, or another user's: not this run's
            env = _environ(pid)
            if env.get(SESSION_VARIABLE) != token:
                continue
            with open(f"/proc/{pid}/stat") as f:
                state, ppid, _pgrp, sid = f.read().rsplit(")", 1)[1].split()[:4]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if state == "Z":  # exited; its parent has not reaped it yet
            continue
        found.append(
            Started(
                pid=pid,
                cmdline=cmdline,
                test=env.get("PYTEST_CURRENT_TEST", "no test (collection or session start)"),
                home=env.get("PREFECT_HOME", "unset: ~/.prefect"),
                session_leader=int(sid) == pid,
                parent=int(ppid),
            )
        )
    return found


def left_behind(token: str) -> list[Started]:
    """What this run started and still runs, but for this process's own helpers."""
    return [p for p in started(token) if not p.ends_with_this_process]


def _signal(process: Started, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if process.session_leader:  # its group is all the suite's: a server and its children
            os.killpg(process.pid, sig)
        else:
            os.kill(process.pid, sig)


def stop(token: str, timeout_s: float = STOP_TIMEOUT_S) -> list[Started]:
    """Stop every process that carries ``token``, by its PID: SIGTERM, then SIGKILL to
    what is still up after ``timeout_s``; those that were running."""
    found = left_behind(token)
    for process in found:
        _signal(process, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while (left := left_behind(token)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for process in left:  # each checked to carry the token just now, so its PID is not reused
        _signal(process, signal.SIGKILL)
    return found


def _still_running(token: str) -> list[Started]:
    """This run's processes still running at its end, after those in the middle of
    exiting (a server the last fixture stopped) were given ``EXIT_GRACE_S`` to finish."""
    deadline = time.monotonic() + EXIT_GRACE_S
    while (found := left_behind(token)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def pytest_configure(config: pytest.Config) -> None:
    global _user_home
    user_env = {k: v for k, v in os.environ.items() if k.startswith("PREFECT_")}
    user_home = Path(user_env.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()
    config.stash[_USER_PREFECT_ENV] = user_env
    config.stash[_USER_HOME] = _user_home = user_home
    config.stash[_USER_HOME_BEFORE] = snapshot(user_home)
    for k in user_env:  # the user's server and profile are not the suite's
        del os.environ[k]
    suite_home = Path(tempfile.mkdtemp(prefix="popflow-suite-prefect-home-"))
    config.stash[_SUITE_HOME] = suite_home
    os.environ["PREFECT_HOME"] = str(suite_home)
    os.environ[SESSION_VARIABLE] = uuid.uuid4().hex


def suite_prefect_home(config: pytest.Config) -> Path:
    """The Prefect home of the suite's own (``PREFECT_HOME`` during the run)."""
    return config.stash[_SUITE_HOME]


def pytest_report_header(config: pytest.Config) -> str:
    return f"popflow: PREFECT_HOME={config.stash[_SUITE_HOME]} (the suite's own)"


@pytest.hookimpl(trylast=True)  # after pytest's own, which tears the fixtures down
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    token = os.environ.get(SESSION_VARIABLE)
    if token is None or _USER_HOME not in config.stash:
        return
    left = _still_running(token) if os.path.isdir("/proc") else []
    if left:
        stop(token)
    user_home = config.stash[_USER_HOME]
    changed = changes(config.stash[_USER_HOME_BEFORE], snapshot(user_home))
    if not left and not changed:
        return
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    lines = []
    if left:
        lines.append(
            f"the suite left {len(left)} process(es) running (stopped now, by their PIDs):"
        )
        for p in left:
            users = " (the user's own)" if is_users_prefect_home(Path(p.home)) else ""
            lines.append(
                f"  {p.kind}, pid {p.pid}, started during {p.test}, "
                f"PREFECT_HOME={p.home}{users}: {p.cmdline[:200]}"
            )
    if changed:
        lines.append(
            f"the suite changed the user's Prefect home {user_home} "
            "(or something else did while it ran: a Prefect server of the user's own):"
        )
        lines += [f"  {line}" for line in changed[:40]]
        if len(changed) > 40:
            lines.append(f"  ... and {len(changed) - 40} more")
    if reporter is not None:
        reporter.write_sep("=", "popflow: what the suite left behind", red=True, bold=True)
        for line in lines:
            reporter.write_line(line, red=True)
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SUITE_HOME not in config.stash:
        return
    shutil.rmtree(config.stash[_SUITE_HOME], ignore_errors=True)
    os.environ.pop(SESSION_VARIABLE, None)
    os.environ.pop("PREFECT_HOME", None)
    os.environ.update(config.stash[_USER_PREFECT_ENV])
