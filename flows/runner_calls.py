"""The runner calls in flight: which trials each one runs, and what comes back.

The controller submits a call per pack of segments (:meth:`RunnerCalls.submit`)
and takes the outcomes as calls return (:meth:`RunnerCalls.returned`). A call
that returns nothing (its worker died, or it could not run there) puts its
trials back to run again from storage; a trial whose calls fail
``MAX_CALL_FAILURES`` times in a row errors. While the driver waits it checks
its lease and watches for segments that run far longer than their peers
(:class:`~popflow.flows.guards.SegmentWatch`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from popflow.flows.guards import SegmentWatch
from popflow.flows.runner_pool import CallFailed, Runner, RunnerPool
from popflow.flows.trial_table import TrialRecord
from popflow.infra.lease import Lease
from popflow.schedulers import TrialStatus
from popflow.tasks.specs import SegmentOutcome, SegmentSpec

logger = logging.getLogger("popflow.flows.controller")

#: A trial whose runner calls return nothing this many times in a row errors.
MAX_CALL_FAILURES = 3


class CodeUnavailable(RuntimeError):
    """A Dask worker cannot load the trials' code: the run stops at once (every trial
    would fail the same way)."""


class RunnerCalls:
    def __init__(self, pool: RunnerPool, segment_timeout_s: float | None, lease: Lease | None):
        self.pool = pool
        self.in_flight: dict[int, list[TrialRecord]] = {}  # runner call -> its trials
        self._failed: dict[str, int] = {}  # trial -> calls in a row that returned nothing
        #: moving average of worker time per segment (None: none returned yet)
        self.segment_seconds: float | None = None
        self.watch = SegmentWatch(segment_timeout_s)
        self._lease = lease
        #: also run while the driver waits (the console's table, to show time passing)
        self.while_waiting: Callable[[], None] | None = None

    def __bool__(self) -> bool:
        return bool(self.in_flight)

    @property
    def running(self) -> int:
        """Trials in flight."""
        return sum(len(recs) for recs in self.in_flight.values())

    def runner_for(self, recs: list[TrialRecord], idle_first: bool = False) -> Runner:
        """Where a call running ``recs`` goes: the worker that parked their trainables (one
        call only holds trials parked on one worker; if that worker is gone, another
        restores them from storage). ``idle_first``: a free runner before a busy one,
        on that worker if it has one free, else elsewhere if the trials' latest
        checkpoints hold their state (:attr:`TrialRecord.movable`)."""
        pinned = next((r.live[1] for r in recs if r.live), None)
        return self.pool.runner_for(pinned, idle_first and all(r.movable for r in recs))

    def submit(self, recs: list[TrialRecord], specs: list[SegmentSpec], runner: Runner) -> None:
        """One call on ``runner`` running ``recs``' segments one after the other."""
        self.in_flight[self.pool.submit(specs, runner)] = recs

    def returned(self) -> list[SegmentOutcome]:
        """Block until some runner calls return; their outcomes."""
        returned = self.pool.finished(on_wait=self._waiting)
        return [o for call, value in returned for o in self._outcomes(call, value)]

    def cancel(self) -> None:
        """Stop every call in flight; their results are not taken."""
        self.pool.cancel()
        self.in_flight.clear()

    def _waiting(self) -> None:
        """While the driver waits: stop if the lease was lost, and watch for segments
        that run far longer than their peers."""
        if self._lease is not None:
            self._lease.check(fresh=False)
        self.watch.look(
            self.pool.started,
            lambda call: ", ".join(r.trial_id for r in self.in_flight.get(call, [])),
            self.pool.worker_of,
            self.segment_seconds or 0.0,
            self.pool.restart_worker,
        )
        if self.while_waiting is not None:
            self.while_waiting()

    def _outcomes(
        self, call: int, value: list[SegmentOutcome] | CallFailed
    ) -> list[SegmentOutcome]:
        recs = self.in_flight.pop(call)
        timed_out = self.watch.returned(call)
        if timed_out is not None:  # the worker was restarted under it: the trials' error
            return [SegmentOutcome(trial_id=r.trial_id, error=timed_out) for r in recs]
        if not isinstance(value, CallFailed):
            for outcome in value:
                self._failed.pop(outcome.trial_id, None)
                avg, seconds = self.segment_seconds, outcome.seconds
                self.segment_seconds = seconds if avg is None else 0.8 * avg + 0.2 * seconds
            return value
        if value.code_missing:
            raise CodeUnavailable(
                f"{value.message}. The Dask workers cannot load the trials' code: install "
                "the trainable's package (and what its config refers to) on the workers, or "
                "keep that code in the trainable's own module, which popflow sends to a "
                "cluster given by dask_address"
            )
        # no outcomes (the worker died, or the call could not run there): run
        # the segments again from storage; a trial whose calls keep failing errors
        outcomes = []
        for rec in recs:
            failed = self._failed.get(rec.trial_id, 0) + 1
            self._failed[rec.trial_id] = failed
            if failed >= MAX_CALL_FAILURES:
                error = f"{value.message} ({failed} times in a row)"
                outcomes.append(SegmentOutcome(trial_id=rec.trial_id, error=error))
            else:
                logger.warning(
                    "trial %s: %s; running its segment again", rec.trial_id, value.message
                )
                rec.live = None
                rec.trial.status = TrialStatus.PENDING
        return outcomes
