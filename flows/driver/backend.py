"""What the driver needs from where segments run: the :class:`Backend` protocol.

The driver (:mod:`popflow.flows.driver.controller`) plans segments and reduces their
outcomes; a backend runs them. Two implement it: the Dask runner pool
(:class:`popflow.flows.backends.dask_backend.DaskBackend`: runner actors on a cluster's
workers) and the simulated backend (:class:`popflow.flows.backends.simulated.SimulatedBackend`:
segments run in this process on a virtual clock). The driver imports neither.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from popflow.flows.driver.clock import Clock
from popflow.flows.experiment.trial_table import TrialRecord
from popflow.tasks.specs import Published, SegmentOutcome, SegmentSpec


class Placement(Protocol):
    """Where a call goes (a backend's own object, handed back to :meth:`Backend.submit`)."""

    #: the worker whose parked trainables a call there may continue
    worker: str


class Backend(Protocol):
    #: the clock the driver reads (real on a cluster, virtual in a simulation)
    clock: Clock
    #: trials suspected of taking a worker down: each runs in a call of its own
    isolated: set[str]
    #: moving average of seconds per segment (None: none returned yet)
    segment_seconds: float | None
    #: called while the driver waits for outcomes (its lease check, the console's tick)
    on_wait: Callable[[], None] | None
    #: a call may return once its segments trained, their checkpoints still publishing
    #: (``SegmentSpec.defer_publish``), settled by :meth:`settle`
    defers_publishes: bool

    @property
    def slots(self) -> int:
        """Segments that can run at once."""
        ...

    @property
    def running(self) -> int:
        """Trials in flight (or waiting for a slot)."""
        ...

    def __bool__(self) -> bool:
        """Calls in flight."""
        ...

    def refresh(self) -> None:
        """Look for slots that joined or left (workers started, workers lost)."""
        ...

    def place(self, recs: list[TrialRecord], idle_first: bool = False) -> Placement | None:
        """Where a call running ``recs``' segments goes: where their trainables are parked,
        or (``idle_first``) a free slot first; None: nowhere now (it waits in
        :meth:`submit`)."""
        ...

    def submit(
        self, recs: list[TrialRecord], specs: list[SegmentSpec], placement: Placement | None
    ) -> None:
        """One call running ``specs`` one after the other at ``placement``."""
        ...

    def returned(self, until: float | None = None) -> list[SegmentOutcome]:
        """Block until some calls return; their outcomes. A call that returned nothing
        puts its trials back to PENDING (they run again). ``until`` (the clock's
        monotonic seconds): none then, if none has returned (a budget's end)."""
        ...

    def settle(self, publishing: set[tuple[str, str]]) -> list[Published]:
        """Block until the publishes that returned calls left running end (each named by
        its outcomes' ``publishing``); what each call's came to."""
        ...

    def cancel(self) -> None:
        """Stop every call in flight; their results are not taken."""
        ...

    def discard_parked(self, worker: str, tokens: list[str]) -> None:
        """Drop trainables parked at ``worker``."""
        ...

    def close(self) -> None:
        """Give every slot back."""
        ...
