"""The processes a pytest run started, read from ``/proc``, and stopping them by PID.

What the run started is every process below it, at any depth. The run makes itself the
*subreaper* of its descendants (``PR_SET_CHILD_SUBREAPER``): a daemon that forks twice,
a server started in a session of its own, the children of a nested pytest that was
killed, all stay below it instead of moving under ``init``. Nothing here reads another
process's environment (a process of another user, or one that made itself undumpable,
hides it); only ``/proc/<pid>/stat`` and ``cmdline``, which anyone may read.

When a process started is its start time (``/proc/<pid>/stat``, in clock ticks since
boot), compared with a :class:`Timeline` of the run's tests: a process a long-lived
helper starts during a later test (a session's Dask worker, a forkserver) is that
test's, whatever environment it inherited.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

#: prctl(2): PR_SET_CHILD_SUBREAPER
_PR_SET_CHILD_SUBREAPER = 36
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Process:
    pid: int
    parent: int
    state: str  # "Z": exited, not reaped yet; "T": stopped
    started: int  # clock ticks since boot
    session: int
    cmdline: str

    @property
    def kind(self) -> str:
        if "prefect" in self.cmdline and " server" in self.cmdline:
            return "a Prefect server"
        if "distributed" in self.cmdline or "dask" in self.cmdline:
            return "a Dask process"
        return "a process"


def read(pid: int) -> Process | None:
    """``pid`` as ``/proc`` shows it now (``None``: gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None
    # the name, in parentheses, may hold anything: the fields are after its last ")"
    fields = stat.rsplit(")", 1)[1].split()
    return Process(
        pid=pid,
        parent=int(fields[1]),
        state=fields[0],
        started=int(fields[19]),
        session=int(fields[3]),
        cmdline=cmdline,
    )


def table() -> dict[int, Process]:
    """Every process this one can see."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (p := read(int(entry))) is not None:
            out[p.pid] = p
    return out


def descendants(root: int, processes: dict[int, Process]) -> list[Process]:
    """The processes below ``root``, at any depth, but those that exited (zombies)."""
    children: dict[int, list[int]] = {}
    for p in processes.values():
        children.setdefault(p.parent, []).append(p.pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(processes[pid])
        todo += children.get(pid, [])
    return [p for p in found if p.state != "Z"]


def become_subreaper() -> bool:
    """Make this process the one its orphaned descendants move under (Linux 3.4+)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def now() -> int:
    """The time in the clock ticks since boot that ``Process.started`` counts."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * CLOCK_TICKS)


class Timeline:
    """What the run was doing, from when: ``mark(what)`` at each phase's start."""

    def __init__(self, first: str) -> None:
        self._ticks = [0]
        self._what = [first]

    def mark(self, what: str) -> None:
        self._ticks.append(now())
        self._what.append(what)

    def during(self, ticks: int, said: str | None = None) -> str:
        """What was going on at ``ticks``. A tick is 10 ms, and several phases may begin in
        one: of those that may have been going on, ``said`` (``PYTEST_CURRENT_TEST`` in the
        process's environment: inherited, so right only if it is one of them) is taken,
        else the last test's call among them, else the last."""
        first = max(bisect.bisect_left(self._ticks, ticks) - 1, 0)  # the last before it
        could_be = self._what[first : bisect.bisect_right(self._ticks, ticks)]
        if said in could_be:
            return said
        calls = [what for what in could_be if what.endswith(" (call)")]
        return (calls or could_be)[-1]


def _signal_all(processes: Iterable[Process], sig: signal.Signals) -> None:
    for p in processes:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p.pid, sig)


def looks(find: Callable[[], list[Process]], n: int = 3) -> list[Process]:
    """What ``find()`` lists in ``n`` looks 50 ms apart, together: one look can miss a
    process that forks and exits as the look goes through ``/proc`` (the child not listed
    yet, the parent gone when read)."""
    found: dict[int, Process] = {}
    for i in range(n):
        if i:
            time.sleep(0.05)
        found.update((p.pid, p) for p in find())
    return list(found.values())


def stop(find: Callable[[], list[Process]], timeout_s: float) -> None:
    """Stop what ``find()`` lists, by PID: SIGTERM, and once those processes exited or
    ``timeout_s`` passed, what is left is frozen (SIGSTOP, again for each process it forked
    meanwhile, until a look finds none new) and killed: a process that forks again and
    again cannot slip away. ``find()`` is called afresh before each signal: a PID it lists
    is alive and still below this process, so it was not reused by another's."""
    termed = {p.pid for p in find()}
    _signal_all((p for p in find() if p.pid in termed), signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while termed & {p.pid for p in find()} and time.monotonic() < deadline:
        time.sleep(0.1)
    deadline = time.monotonic() + timeout_s
    while looks(find) and time.monotonic() < deadline:
        frozen: set[int] = set()
        while fresh := [p for p in looks(find) if p.pid not in frozen]:
            _signal_all(fresh, signal.SIGSTOP)
            frozen |= {p.pid for p in fresh}
        _signal_all(find(), signal.SIGKILL)


def environment(pid: int) -> dict[str, str] | None:
    """``pid``'s environment as it started (``None``: hidden from this process)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            pairs = f.read().split(b"\0")
    except OSError:
        return None
    return dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)
