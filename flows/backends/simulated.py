"""The simulated backend: segments run in this process, on a virtual clock.

Each call runs at once, in the driver's thread, through the same code a Dask worker
runs (:func:`popflow.tasks.segment.run_segments`); the clock then says when it would
have returned: a call starts when its slot frees and takes the virtual seconds of its
results (``duration``: a number per result, a result key such as ``"time_this_iter_s"``,
or a function of the result), which the results' own ``time_this_iter_s`` and
``time_total_s`` then say. :meth:`SimulatedBackend.returned` hands back the calls in
the order they would have finished, moving the clock on. No process starts, nothing
sleeps; the same inputs give the same run.

Syne Tune's simulator replays tabulated benchmarks the same way (Salinas et al., 2022,
https://arxiv.org/abs/2201.05582); popflow's replays a user's own trainable or a finished
experiment's learning curves (:mod:`popflow.flows.api.simulate`).

The driver's lease runs on the same clock (:class:`VirtualLease`): a simulated driver
that stalls past its lease's ttl of virtual seconds is taken over as a real one would be.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from popflow.flows.driver.clock import VirtualClock
from popflow.flows.experiment.trial_table import TrialRecord
from popflow.infra.storage.folder import Storage
from popflow.infra.store.lease import LOOK_EVERY_S, Lease
from popflow.tasks.live import discard_parked
from popflow.tasks.segment import run_segments
from popflow.tasks.specs import Published, SegmentOutcome, SegmentSpec

#: The worker name a simulation's parked trainables live under (this process).
SIMULATED_WORKER = "simulated"

Duration = float | str | Callable[[dict[str, Any]], float]


@dataclass(frozen=True)
class Slot:
    """A simulated trial slot (every slot is in this process: one worker)."""

    index: int
    worker: str = SIMULATED_WORKER


def duration_of(duration: Duration) -> Callable[[dict[str, Any]], float]:
    """``duration`` as a function of one result (its virtual seconds)."""
    if callable(duration):
        return duration
    if isinstance(duration, str):
        key = duration

        def reported(result: dict[str, Any]) -> float:
            value = result.get(key)
            if not isinstance(value, numbers.Real) or isinstance(value, bool) or value < 0:
                raise ValueError(
                    f"`duration` is {key!r}, but a result has {key}={value!r}: each result "
                    "must report a number of seconds >= 0 there"
                )
            return float(value)

        return reported
    if isinstance(duration, bool) or not isinstance(duration, numbers.Real) or duration < 0:
        raise ValueError(
            f"`duration` is {duration!r}, but must be seconds per result (a number >= 0), "
            "a result key, or a function of a result"
        )
    seconds = float(duration)
    return lambda result: seconds


class SimulatedBackend:
    """``slots`` trial slots on a :class:`~popflow.flows.driver.clock.VirtualClock`."""

    def __init__(
        self, slots: int = 1, duration: Duration = 1.0, clock: VirtualClock | None = None
    ) -> None:
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"`slots` is {slots!r}, but must be a whole number >= 1")
        self.clock = clock or VirtualClock()
        self._slots = slots
        self._duration = duration_of(duration)
        self.isolated: set[str] = set()
        self.segment_seconds: float | None = None
        self.on_wait: Callable[[], None] | None = None
        self._free_at = [0.0] * slots  # when each slot is free (virtual seconds)
        self._calls: list[tuple[float, int, list[SegmentOutcome], int]] = []  # a heap
        self._seq = itertools.count()
        #: results run, virtual seconds the slots were busy (what the run cost)
        self.results = 0
        self.busy_s = 0.0

    @property
    def slots(self) -> int:
        return self._slots

    @property
    def running(self) -> int:
        return sum(n for *_, n in self._calls)

    def __bool__(self) -> bool:
        return bool(self._calls)

    def refresh(self) -> None:
        """Slots never come or go in a simulation."""

    def place(self, recs: list[TrialRecord], idle_first: bool = False) -> Slot:
        """The slot that frees first (the lowest index among equals)."""
        index = min(range(self._slots), key=lambda i: (self._free_at[i], i))
        return Slot(index)

    def submit(
        self, recs: list[TrialRecord], specs: list[SegmentSpec], placement: Slot | None
    ) -> None:
        slot = placement if placement is not None else self.place(recs)
        # each iteration's auto-filled times are virtual: time-based schedulers and
        # stoppers (Ray's default time_attr is time_total_s) see the simulated clock
        timed = [dataclasses.replace(s, iteration_seconds=self._duration) for s in specs]
        outcomes = run_segments(timed, SIMULATED_WORKER)
        for outcome in outcomes:
            outcome.seconds = sum(r["time_this_iter_s"] for r in outcome.results)
        seconds = sum(o.seconds for o in outcomes)
        self.results += sum(len(o.results) for o in outcomes)
        self.busy_s += seconds
        start = max(self.clock.monotonic(), self._free_at[slot.index])
        self._free_at[slot.index] = start + seconds
        heapq.heappush(self._calls, (start + seconds, next(self._seq), outcomes, len(specs)))

    def returned(self, until: float | None = None) -> list[SegmentOutcome]:
        """The calls that finish first (those finishing at the same moment together);
        none if the first finishes after ``until`` (the clock moves on to it)."""
        if not self._calls:
            return []
        at = self._calls[0][0]
        if until is not None and at > until:
            self.clock.advance_to(until)
            return []
        self.clock.advance_to(at)
        outcomes: list[SegmentOutcome] = []
        while self._calls and self._calls[0][0] <= at:
            outcomes.extend(heapq.heappop(self._calls)[2])
        for outcome in outcomes:
            avg, seconds = self.segment_seconds, outcome.seconds
            self.segment_seconds = seconds if avg is None else 0.8 * avg + 0.2 * seconds
        return outcomes

    def cancel(self) -> None:
        """Calls in flight are dropped; their trainables parked here go too."""
        now = self.clock.monotonic()
        tokens = [o.live_token for *_, outs, _ in self._calls for o in outs if o.live_token]
        discard_parked(tokens)
        self._calls.clear()
        self._free_at = [min(free, now) for free in self._free_at]

    #: calls run to the end here, their checkpoints published (none is deferred)
    defers_publishes = False

    def settle(self, publishing: set[tuple[str, str]]) -> list[Published]:
        return []

    def discard_parked(self, worker: str, tokens: list[str]) -> None:
        discard_parked(tokens)

    def close(self) -> None:
        self.cancel()


class VirtualLease(Lease):
    """The experiment's lease on a :class:`~popflow.flows.driver.clock.VirtualClock`.

    Its expiries are virtual seconds and it is renewed inline, when the driver checks it
    and a third of its ttl has passed since it was last written, rather than from a
    thread of its own (a simulation runs one thread per driver: see
    :mod:`popflow.infra.helper_threads`). A driver that stops checking (it stalls) stops
    renewing, as a stopped process does. ``force``: ``--force-takeover``.
    """

    def __init__(
        self, storage: Storage, ttl_s: float, clock: VirtualClock, force: bool = False
    ) -> None:
        super().__init__(storage, ttl_s, clock=clock.time, force=force)
        self.virtual = clock
        self._renewed: float | None = None  # when it was last written (virtual monotonic)

    def acquire(self, renew: bool = True) -> None:
        super().acquire(renew=False)
        self._renewed = self.virtual.monotonic()

    def check(self, fresh: bool = True) -> None:
        now = self.virtual.monotonic()
        if self._renewed is not None and now - self._renewed >= self.ttl_s / 3:
            self._renewed = now
            self.renew_once()
        super().check(fresh)

    def guard(
        self, every_s: float = LOOK_EVERY_S, monotonic: Callable[[], float] | None = None
    ) -> Callable[[], None]:
        return super().guard(every_s, monotonic or self.virtual.monotonic)
