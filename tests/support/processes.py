"""The processes a pytest run started, read from ``/proc``, and stopping them by PID.

What the run started is every process below it, at any depth, started since it began.
The run makes itself the *subreaper* of its descendants (``PR_SET_CHILD_SUBREAPER``): a
daemon that forks twice, a server started in a session of its own, the children of a
nested pytest that was killed, all stay below it instead of moving under ``init``. The
tree is walked through each process's children lists (``/proc/<pid>/task/*/children``):
one read per process, so a process that forks and exits as fast as it can is still found,
as the child of its parent or, orphaned, of the run. Nothing here needs another
process's environment (another user's process, or an undumpable one, hides it).

Which test started a process: the phase (a test's setup, call or teardown) at whose end
it was first seen below the run (:class:`Timeline`); one that started and was gone
within a phase is not seen, and one seen first at the end is placed by its start time
(clock ticks since boot, 10 ms each).

The run reaps the orphans it adopts when they exit (:class:`Spawns`), but never a child it
started itself: that one's ``Popen`` or ``Process`` waits for it.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import functools
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
    group: int  # its process group
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
        group=int(fields[2]),
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


def children(pid: int) -> list[int]:
    """``pid``'s children now: each of its threads lists those it started or adopted."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:  # the thread ended
            continue
    return out


def subtree(root: int) -> list[Process]:
    """The processes below ``root`` (zombies included), walked through children lists,
    again until ``root``'s own list is the same after the walk as before it: a process
    that exited during the walk left its children to ``root`` (its subreaper), which a
    walk that had read ``root``'s list already would miss."""
    for _ in range(100):
        first = children(root)
        found = _walk(first)
        if children(root) == first:
            break
    return found


def _walk(pids: list[int]) -> list[Process]:
    found, todo, seen = [], list(pids), set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        if (p := read(pid)) is not None:
            found.append(p)
            todo += children(pid)
    return found


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
    """What the run was doing, from when (``mark(what)`` as each phase begins), and in
    which phase each process below ``root`` was first seen (looked for at each mark)."""

    def __init__(self, first: str, root: int) -> None:
        self._ticks = [0]
        self._what = [first]
        self._root = root
        self._first_seen: dict[tuple[int, int], str] = {}
        self.look()

    def look(self) -> list[Process]:
        """The processes below ``root`` now; those new are the current phase's."""
        below = subtree(self._root)
        for p in below:
            self._first_seen.setdefault((p.pid, p.started), self._what[-1])
        return below

    def mark(self, what: str) -> list[Process]:
        """``what`` begins now; the processes below ``root`` as the last phase ended."""
        below = self.look()
        self._ticks.append(now())
        self._what.append(what)
        return below

    def started_during(self, p: Process, said: str | None = None) -> str:
        """The phase in which ``p`` started: where it was first seen, else by its time."""
        return self._first_seen.get((p.pid, p.started)) or self.during(p.started, said)

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


class Spawns:
    """The children this process starts itself, by PID, recorded by the calls that start
    them (subprocess's and multiprocessing's ``fork_exec``, ``os.fork``,
    ``os.posix_spawn``): any other child of this subreaper is an orphan it adopted, which
    nobody else waits for, and which it reaps once it exits."""

    def __init__(self) -> None:
        self.pids: set[int] = set()
        self._undo: list[Callable[[], None]] = []

    def start(self) -> None:
        import _posixsubprocess
        import subprocess

        for module, name in (
            (subprocess, "_fork_exec"),
            (_posixsubprocess, "fork_exec"),
            (os, "fork"),
            (os, "posix_spawn"),
            (os, "posix_spawnp"),
        ):
            if getattr(module, name, None) is not None:
                self._wrap(module, name)

    def _wrap(self, module: object, name: str) -> None:
        original = getattr(module, name)

        @functools.wraps(original)
        def recorded(*args: object, **kwargs: object) -> object:
            pid = original(*args, **kwargs)
            if pid:  # 0: this is the child of a fork
                self.pids.add(pid)
            return pid

        setattr(module, name, recorded)
        self._undo.append(lambda: setattr(module, name, original))

    def stop(self) -> None:
        while self._undo:
            self._undo.pop()()

    def reap_adopted(self, below: list[Process], root: int) -> None:
        """Reap each of ``root``'s exited children that it did not start."""
        for p in below:
            if p.parent == root and p.state == "Z" and p.pid not in self.pids:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(p.pid, os.WNOHANG)


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


def members(group: int) -> list[Process]:
    """The live processes of process ``group`` if it is still this process's
    (:func:`is_ours`), listed while the group is stopped (one SIGSTOP reaches all its
    processes at once; SIGCONT after): none forks or exits while ``/proc`` is read."""
    if not is_ours(group):
        return []
    try:
        os.killpg(group, signal.SIGSTOP)
    except (ProcessLookupError, PermissionError):
        return []
    try:
        return [p for p in table().values() if p.group == group and p.state != "Z"]
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGCONT)


def is_ours(group: int) -> bool:
    """A process of ``group`` is this process's child (a zombie it has not reaped
    counts): the group is still the one a descendant made, not another's that took its
    number once it was free. (A group of the run's whose processes are all deeper and
    fork too fast to be seen is not signalled as a group.)"""
    root = os.getpid()
    return any(p.group == group and p.parent == root for p in table().values())


def _signal_groups(groups: Iterable[int], sig: signal.Signals) -> None:
    for group in groups:
        if is_ours(group):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)


def stop(find: Callable[[], list[Process]], timeout_s: float, groups: set[int]) -> None:
    """Stop what ``find()`` lists, by PID: SIGTERM, and once those processes exited or
    ``timeout_s`` passed, what is left is frozen (SIGSTOP, again for each process it forked
    meanwhile, until a look finds none new) and killed, and so is each of ``groups`` (the
    process groups of its own that the run's processes made): a process that forks again
    and again cannot slip away, even one that forks faster than ``/proc`` can be read.
    ``find()`` is called afresh before each signal: a PID it lists is alive and still
    below this process, so it was not reused by another's."""
    termed = {p.pid for p in find()}
    _signal_all((p for p in find() if p.pid in termed), signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while termed & {p.pid for p in find()} and time.monotonic() < deadline:
        time.sleep(0.1)
    deadline = time.monotonic() + timeout_s
    while True:
        _signal_groups(groups, signal.SIGSTOP)
        frozen: set[int] = set()
        while fresh := [p for p in looks(find) if p.pid not in frozen]:
            _signal_all(fresh, signal.SIGSTOP)
            frozen |= {p.pid for p in fresh}
        _signal_all(find(), signal.SIGKILL)
        _signal_groups(groups, signal.SIGKILL)
        if not (looks(find) or any(map(members, groups))):
            return
        if time.monotonic() > deadline:
            return
        time.sleep(0.1)


def environment(pid: int) -> dict[str, str] | None:
    """``pid``'s environment as it started (``None``: hidden from this process)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            pairs = f.read().split(b"\0")
    except OSError:
        return None
    return dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)
