"""The Dask backend: segments run on runner actors on a cluster's workers
(:mod:`popflow.flows.backends.dask_pool`); this module keeps the calls in flight, which
trials each one runs, and what comes back (the driver's
:class:`~popflow.flows.driver.backend.Backend`).

The driver submits a call per pack of segments (:meth:`DaskBackend.submit`)
and takes the outcomes as calls return (:meth:`DaskBackend.returned`). A call
that returns nothing puts its trials back to run again from storage:

- its worker died: the trials whose call was only waiting there are not to blame
  and run again elsewhere. Those whose segments were running there are suspects,
  but none is blamed yet (a call that had just finished may not have sent its
  result back before the next one took the process down): each runs its next
  segment alone, in quarantine (:attr:`DaskBackend.isolated`): a call of its own
  on a worker where nothing else runs until it returns. A trial whose worker dies
  in quarantine took the process down (``os._exit``, a segfault, its memory): that
  is its failure, retried like any other
  (:meth:`~popflow.flows.driver.ending_trials.EndingTrials._on_error`); one whose segment
  returns is cleared. Packs of segments waiting for a free worker are kept here
  and sent as workers free up;
- it could not run there (say, its arguments did not unpickle): a trial whose calls
  fail so ``MAX_CALL_FAILURES`` times in a row errors.

While the driver waits (its lease checked, its console ticked: :attr:`DaskBackend.on_wait`)
the backend watches for segments that run far longer than their peers
(:class:`~popflow.flows.backends.segment_watch.SegmentWatch`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from popflow.flows.backends.dask_pool import RunnerPool
from popflow.flows.backends.runners import CallFailed, Runner
from popflow.flows.backends.segment_watch import SegmentWatch
from popflow.flows.driver.clock import SystemClock
from popflow.flows.experiment.trial_table import TrialRecord
from popflow.schedulers import TrialStatus
from popflow.tasks.dask_sampling import isolate_dask_sampling
from popflow.tasks.specs import EndReason, Published, SegmentOutcome, SegmentSpec

logger = logging.getLogger(__name__)

#: A trial whose runner calls return nothing this many times in a row errors.
MAX_CALL_FAILURES = 3


class CodeUnavailable(RuntimeError):
    """A Dask worker cannot load the trials' code: the run stops at once (every trial
    would fail the same way)."""


class DaskBackend:
    """Segments on a cluster's workers, through ``pool``'s runner actors."""

    def __init__(self, pool: RunnerPool, segment_timeout_s: float | None = None) -> None:
        self.pool = pool
        self.clock = SystemClock()
        isolate_dask_sampling()  # dask.sizeof's sampling off this driver's seeded streams
        self.in_flight: dict[int, list[TrialRecord]] = {}  # runner call -> its trials
        self._failed: dict[str, int] = {}  # trial -> calls in a row that returned nothing
        #: trials suspected of taking a worker down: their segments run in quarantine
        self.isolated: set[str] = set()
        #: packs waiting for a runner (every worker busy with a quarantined call)
        self._deferred: list[tuple[list[TrialRecord], list[SegmentSpec]]] = []
        #: moving average of worker time per segment (None: none returned yet)
        self.segment_seconds: float | None = None
        self.watch = SegmentWatch(segment_timeout_s)
        #: run first whenever the driver waits (its lease check, the console's tick)
        self.on_wait: Callable[[], None] | None = None

    @property
    def slots(self) -> int:
        return self.pool.slots

    def refresh(self) -> None:
        """Pick up workers that joined (at most every few seconds)."""
        self.pool.refresh_soon()

    #: calls may return before their checkpoints are published (``SegmentSpec.defer_publish``)
    defers_publishes = True

    def settle(self, publishing: set[tuple[str, str]]) -> list[Published]:
        """Wait for the publishes deferred calls left running (see the pool's ``settle``)."""
        return self.pool.settle(sorted(publishing), on_wait=self._waiting)

    def discard_parked(self, worker: str, tokens: list[str]) -> None:
        self.pool.discard_parked(worker, tokens)

    def close(self) -> None:
        self.pool.close()

    def __bool__(self) -> bool:
        return bool(self.in_flight) or bool(self._deferred)

    @property
    def running(self) -> int:
        """Trials in flight (or waiting for a runner)."""
        flying = sum(len(recs) for recs in self.in_flight.values())
        return flying + sum(len(recs) for recs, _ in self._deferred)

    def _alone(self, recs: list[TrialRecord]) -> bool:
        return len(recs) == 1 and recs[0].trial_id in self.isolated

    def place(self, recs: list[TrialRecord], idle_first: bool = False) -> Runner | None:
        """Where a call running ``recs`` goes: the worker that parked their trainables (one
        call only holds trials parked on one worker; if that worker is gone, another
        restores them from storage). ``idle_first``: a free runner before a busy one,
        on that worker if it has one free, else elsewhere if the trials' latest
        checkpoints hold their state (:attr:`TrialRecord.movable`). A suspect goes to
        a worker of its own (quarantine). None: no runner can take it now."""
        if self._alone(recs):
            return self.pool.exclusive_runner()
        pinned = next((r.live[1] for r in recs if r.live), None)
        return self.pool.runner_for(pinned, idle_first and all(r.movable for r in recs))

    def submit(
        self, recs: list[TrialRecord], specs: list[SegmentSpec], runner: Runner | None
    ) -> None:
        """One call on ``runner`` running ``recs``' segments one after the other; with no
        runner (:meth:`place` found none), it waits and goes once one frees."""
        if runner is None:
            self._deferred.append((recs, specs))
            return
        sized = [s.slot_resources for s in specs if s.slot_resources is not None]
        if (
            sized and self.pool.resizes
        ):  # a ResourceChangingScheduler's trials: the slot holds what they do
            want = {k: max(s.get(k, 0.0) for s in sized) for k in {k for s in sized for k in s}}
            if dict(runner.resources or {}) != want:
                if runner.queued:  # calls ahead of it hold the slot as it is: wait for them
                    self._deferred.append((recs, specs))
                    return
                resized = self.pool.resize(runner, want)
                if resized is None:  # its worker left: another runner takes the call
                    self._deferred.append((recs, specs))
                    return
                runner = resized
        call = self.pool.submit(specs, runner, exclusive=self._alone(recs))
        self.in_flight[call] = recs

    def _send_deferred(self) -> None:
        waiting, self._deferred = self._deferred, []
        for recs, specs in waiting:
            self.submit(recs, specs, self.place(recs))

    def returned(self, until: float | None = None) -> list[SegmentOutcome]:
        """Block until some runner calls return (or ``until``: none); their outcomes."""
        self._send_deferred()
        returned = self.pool.finished(on_wait=self._waiting, until=until)
        outcomes = [o for call, value in returned for o in self._outcomes(call, value)]
        self._send_deferred()
        return outcomes

    def cancel(self) -> None:
        """Stop every call in flight; their results are not taken."""
        self.pool.cancel()
        self.in_flight.clear()
        self._deferred.clear()

    def _waiting(self) -> None:
        """While the driver waits: its own look first (a lost lease stops it before
        anything more is sent), then the deferred packs, and segments that run far
        longer than their peers."""
        if self.on_wait is not None:
            self.on_wait()
        self._send_deferred()
        self.watch.look(
            self.pool.started,
            lambda call: ", ".join(r.trial_id for r in self.in_flight.get(call, [])),
            self.pool.worker_of,
            self.segment_seconds,
            self.pool.restart_worker,
        )

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
                if outcome.reason != EndReason.ERROR:
                    self.isolated.discard(outcome.trial_id)
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
        if value.worker_lost:
            return [o for rec in recs if (o := self._worker_died(rec, value)) is not None]
        # no outcomes (the call could not run there): run the segments again from
        # storage; a trial whose calls keep failing errors
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

    def _worker_died(self, rec: TrialRecord, value: CallFailed) -> SegmentOutcome | None:
        """``rec``'s call failed because its worker died: its failure if it ran there in
        quarantine (see the module's doc), else None, and it runs again."""
        rec.live = None  # its parked trainable died with the process
        if value.running:
            self.isolated.add(rec.trial_id)
        if value.alone:
            return SegmentOutcome(
                trial_id=rec.trial_id,
                error=f"its worker process died while it ran there alone: {value.message}",
                lost_worker=True,
            )
        logger.info(
            "trial %s: %s %s; running it again%s",
            rec.trial_id,
            value.message,
            "while it ran there" if value.running else "before it ran",
            " alone, in quarantine" if value.running else "",
        )
        rec.trial.status = TrialStatus.PENDING
        return None
