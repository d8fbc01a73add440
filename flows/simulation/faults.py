"""Faults at storage calls: what a schedule holds, and the storage that obeys it.

A :class:`Schedule` is a scenario (the experiment a schedule runs) and a list of
``(call index, fault)``: at the ``index``-th storage call of the whole simulated world
(every driver's calls counted in the one order the baton gives them,
:mod:`popflow.flows.simulation.world`), the fault happens. A schedule prints as one line
(``pbt/3x4/s2:17=crash,40=stall``) and is read back from it, so a failing one replays
exactly.

:class:`FaultStorage` is a :class:`~popflow.infra.storage.folder.Storage` whose every
filesystem call (:meth:`~popflow.infra.storage.calls.StorageCalls._call`, the one place a
Storage calls its filesystem) asks its driver's :class:`Hook` first. It is handed to the
driver as the run's storage; the experiment's storage (``storage.child(name)``) and
everything the driver and its segments derive from it stay fault storages.
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from popflow.infra.storage.folder import Storage

T = TypeVar("T")


class SimulatedCrash(BaseException):
    """The simulated driver's process died at a storage call: nothing after it runs.

    A ``BaseException`` (as ``SystemExit``), so ``except Exception`` in the driver does
    not swallow it; and every later call of that driver's storage raises it again, so
    the ``finally`` blocks it unwinds through change nothing in storage either.
    """


class Fault(enum.Enum):
    """What happens at a storage call."""

    #: the call fails for good, as a storage that retried and gave up (StorageError)
    FAIL = "fail"
    #: the call takes a while: the virtual clock moves on first
    DELAY = "delay"
    #: the driver dies before the call reaches storage
    CRASH = "crash"
    #: the call lands, then the driver dies before it sees the answer
    CRASH_AFTER = "crash_after"
    #: an append lands half, then the driver dies (other calls: as CRASH_AFTER)
    TORN = "torn"
    #: the driver stops here (SIGSTOP) past its lease; another driver resumes the
    #: experiment and runs; then this one wakes and goes on with the call
    STALL = "stall"
    #: as STALL, but the other driver forces a takeover at once (--force-takeover)
    STALL_FORCE = "stall_force"
    #: as STALL, but inside the call: past the call's own checks, just before its bytes
    #: land (a derived log's append or adoption on local disk, where the check and the
    #: write are two steps of one call); at other calls, as STALL
    STALL_INSIDE = "stall_inside"
    #: the next segment call the driver sends stalls on its worker (SIGSTOP): the worker is
    #: declared dead and the same driver runs the segments again; once it has committed
    #: what the new attempt made (or once it ends), the stale attempt wakes and runs on,
    #: publishing what it trains (issue 46, Break A). The storage call itself goes on
    STALL_SEGMENT = "stall_segment"
    #: a lease file is planted for the next epoch with ttl and expiry 1e300, an hour old
    FORGE_LEASE = "forge_lease"
    #: a garbled lease file ``99999999.json`` is planted
    GARBLE_LEASE = "garble_lease"
    #: the newest published checkpoint's data file is overwritten with other bytes
    DAMAGE_CHECKPOINT = "damage_checkpoint"


#: Faults that end the driver at the call
DEATHS = frozenset({Fault.CRASH, Fault.CRASH_AFTER, Fault.TORN})
#: Faults that plant or damage files and let the call go on
PLANTS = frozenset({Fault.FORGE_LEASE, Fault.GARBLE_LEASE, Fault.DAMAGE_CHECKPOINT})


@dataclass(frozen=True)
class Scenario:
    """The experiment a schedule runs: ``kind`` (``pbt``: synchronous PBT; ``hyperband``;
    ``asha``; ``searcher``: FIFO with a searcher that suggests each trial), ``trials``,
    ``iterations`` each, on ``slots`` simulated slots."""

    kind: str
    trials: int
    iterations: int
    slots: int

    KINDS = ("pbt", "hyperband", "asha", "searcher")

    @property
    def synchronous(self) -> bool:
        """Its runs must end identical to an undisturbed one."""
        return self.kind in ("pbt", "hyperband", "searcher")

    def __str__(self) -> str:
        return f"{self.kind}/{self.trials}x{self.iterations}/s{self.slots}"

    @classmethod
    def parse(cls, text: str) -> Scenario:
        kind, size, slots = text.split("/")
        trials, iterations = size.split("x")
        if kind not in cls.KINDS or not slots.startswith("s"):
            raise ValueError(f"not a scenario: {text!r} (e.g. 'pbt/3x4/s2')")
        return cls(kind, int(trials), int(iterations), int(slots[1:]))


@dataclass(frozen=True)
class Schedule:
    """A scenario and its faults, ``(call index, fault)`` in index order."""

    scenario: Scenario
    faults: tuple[tuple[int, Fault], ...] = field(default=())

    def __str__(self) -> str:
        return f"{self.scenario}:" + ",".join(f"{i}={f.value}" for i, f in self.faults)

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """The schedule ``str(schedule)`` printed."""
        scenario, _, faults = text.strip().partition(":")
        pairs = []
        for item in filter(None, faults.split(",")):
            index, _, fault = item.partition("=")
            pairs.append((int(index), Fault(fault)))
        return cls(Scenario.parse(scenario), tuple(sorted(pairs, key=lambda p: p[0])))

    def at(self) -> dict[int, Fault]:
        return dict(self.faults)


class Hook(Protocol):
    """What a :class:`FaultStorage` asks at each call (a simulated driver)."""

    def call(self, storage: FaultStorage, op: str, path: str, run: Callable[[], T]) -> T:
        """Run ``run`` (the call ``op`` on ``path``), faults and all."""
        ...


class FaultStorage(Storage):
    """A Storage whose filesystem calls go through ``hook`` (a simulated driver)."""

    hook: Hook
    #: the append in progress (its path and bytes): a torn append lands half of them
    appending: tuple[str, bytes] | None = None

    @classmethod
    def over(cls, storage: Storage, hook: Hook) -> FaultStorage:
        """``storage``'s root, its calls through ``hook``."""
        made = cls(storage.url, storage.storage_options, storage.retry)
        made.hook = hook
        return made

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["appending"] = None
        return state

    def child(self, *parts: str) -> FaultStorage:
        sub = copy.copy(self)  # the same class and hook
        sub.root = self.path(*parts)
        sub._fs = self._fs
        return sub

    def _call(self, op: str, path: str, fn: Callable[[], T], *, retry: bool = True) -> T:
        return self.hook.call(
            self, op, path, lambda: super(FaultStorage, self)._call(op, path, fn, retry=retry)
        )

    def append_text(self, text: str, *parts: str) -> int:
        self.appending = (self.path(*parts), text.encode("utf-8"))
        try:
            return super().append_text(text, *parts)
        finally:
            self.appending = None

    def modified(self, *parts: str) -> float:
        """When the file was last written by the simulated world's clock (lease expiries
        are capped by it); the filesystem's time for a file written otherwise."""
        p = self.path(*parts)
        return self._call("stat", p, lambda: self.hook_mtime(p))

    def hook_mtime(self, path: str) -> float:
        written = getattr(self.hook, "written", {}).get(path)
        return written if written is not None else self.fs.modified(path).timestamp()
