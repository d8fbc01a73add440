"""A simulated backend whose segment calls can stall on their worker
(:attr:`~popflow.flows.simulation.faults.Fault.STALL_SEGMENT`).

A Dask worker SIGSTOPped mid-segment is declared dead by the scheduler (its TTL): the
driver runs the call's segments again elsewhere, and commits what they made. The stopped
worker then wakes and goes on: it publishes the checkpoints it trains, with the driver
epoch it was sent with. :class:`StallingBackend` plays that: the call it is told to stall
does not run; at the virtual moment its worker would be declared dead it returns no
outcome, the trials pending again (as :class:`~popflow.flows.backends.dask_backend.DaskBackend`
does for a lost worker); the stale call runs later (:meth:`StallingBackend.wake`), from
its own spec, on the same storage, its outcome thrown away. The trainable is
deterministic, so running the call late is what the woken worker would have done.
"""

from __future__ import annotations

import copy
import dataclasses
import heapq
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from popflow.flows.backends.simulated import SIMULATED_WORKER, SimulatedBackend, Slot
from popflow.flows.experiment.trial_table import TrialRecord
from popflow.flows.simulation.faults import FaultStorage
from popflow.schedulers import TrialStatus
from popflow.tasks.segment import run_segments
from popflow.tasks.specs import SegmentOutcome, SegmentSpec

T = TypeVar("T")

#: Virtual seconds until a stopped worker is declared dead (Dask's worker TTL, scaled)
DECLARED_DEAD_S = 1.0


class _Unwatched:
    """A stale worker's storage calls: no driver's, so no fault, no count, no baton."""

    def call(self, storage: FaultStorage, op: str, path: str, run: Callable[[], T]) -> T:
        return run()


@dataclass
class StaleCall:
    """A call whose worker stopped: its specs, and the trials the driver has yet to see
    return from their new attempt."""

    specs: list[SegmentSpec]
    waiting: set[str] = field(default_factory=set)


class StallingBackend(SimulatedBackend):
    """:class:`~popflow.flows.backends.simulated.SimulatedBackend` whose next call stalls
    once :meth:`stall_next` is called."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._due = 0
        self._lost: dict[int, tuple[list[TrialRecord], list[SegmentSpec]]] = {}
        self.stale: list[StaleCall] = []

    def stall_next(self) -> None:
        self._due += 1

    def submit(
        self, recs: list[TrialRecord], specs: list[SegmentSpec], placement: Slot | None
    ) -> None:
        if not self._due:
            super().submit(recs, specs, placement)
            return
        self._due -= 1
        slot = placement if placement is not None else self.place(recs)
        start = max(self.clock.monotonic(), self._free_at[slot.index])
        seq = next(self._seq)
        self._lost[seq] = (recs, list(specs))
        self._free_at[slot.index] = start + DECLARED_DEAD_S
        heapq.heappush(self._calls, (start + DECLARED_DEAD_S, seq, [], len(specs)))

    def returned(self, until: float | None = None) -> list[SegmentOutcome]:
        if not self._calls:
            return []
        at = self._calls[0][0]
        if until is not None and at > until:
            return super().returned(until)  # none yet: the clock moves on to ``until``
        lost = [seq for when, seq, *_ in self._calls if when <= at and seq in self._lost]
        outcomes = super().returned()
        for seq in lost:  # declared dead: the trials run again (their next attempt)
            recs, specs = self._lost.pop(seq)
            for rec in recs:
                rec.live = None  # on the stopped worker
                rec.trial.status = TrialStatus.PENDING
            self.stale.append(StaleCall(specs, {r.trial_id for r in recs}))
        for outcome in outcomes:
            for call in self.stale:
                call.waiting.discard(outcome.trial_id)
        return outcomes

    def cancel(self) -> None:
        super().cancel()
        self._lost.clear()

    def wake(self, all_of_them: bool = False) -> int:
        """Run the stale calls whose trials' new attempts have returned (``all_of_them``:
        every one); how many ran."""
        ready = [c for c in self.stale if all_of_them or not c.waiting]
        self.stale = [c for c in self.stale if c not in ready]
        for call in ready:
            specs = []
            for spec in call.specs:
                storage = copy.copy(spec.storage)
                storage.hook = _Unwatched()  # type: ignore[attr-defined]
                specs.append(
                    dataclasses.replace(spec, storage=storage, iteration_seconds=self._duration)
                )
            run_segments(specs, SIMULATED_WORKER)  # what it made is no one's: thrown away
        return len(ready)
