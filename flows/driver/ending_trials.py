"""How a controller's trials end other than by finishing: a trial's error (retried or
for good), a checkpoint that failed its check, the experiment stopped early, the run's
budget spent. A mixin of :class:`popflow.flows.driver.controller.Controller`, whose state it
uses; split from it to keep one idea per module."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from popflow.flows.experiment.trial_table import TrialRecord, fall_back_from
from popflow.flows.record.run_log import last_line, run_logger
from popflow.infra.store.layout import ERROR_FILE
from popflow.schedulers import TrialStatus
from popflow.tasks.specs import SegmentOutcome

logger = logging.getLogger(__name__)

#: A trial whose worker process died while it ran there alone is retried at least this
#: often, whatever ``max_failures`` says: the kernel's OOM killer, a preempted machine
#: or a signal from outside end a process too, and a one-off is no reason to error.
LOST_WORKER_RETRIES = 2


class EndingTrials:
    if TYPE_CHECKING:  # the controller's, used here
        spec: Any
        storage: Any
        records: list[TrialRecord]
        by_id: dict[str, TrialRecord]
        retries: Any
        hooks: Any
        table: Any
        calls: Any
        scheduler: Any
        early_end: Any
        index: Any
        _events: list[str]

        def _record(self, rec: TrialRecord, result: dict[str, Any]) -> None: ...
        def _check_lease(self) -> None: ...
        def _discard_live(self, rec: TrialRecord) -> None: ...
        def _flush_discards(self) -> None: ...
        def commit(self, final: bool = False) -> None: ...

    def _pending(self, trial_id: str) -> bool:
        return self.by_id[trial_id].trial.status == TrialStatus.PENDING

    def _await_retry(self) -> bool:
        """Nothing runs, but a failed trial waits out its backoff: sleep until it may
        run again (True), or False if none waits."""
        waits = self.retries.waiting(self._pending)
        if not waits:
            return False
        time.sleep(max(0.0, min(waits) - time.monotonic()))
        return True

    def _falls_back(self, outcome: SegmentOutcome) -> bool:
        """The segment could not restore: its checkpoint failed its check. True if an
        earlier one is used instead (storage's fault, not the trial's: it runs again, in a
        synchronous round within the round, so results reach the scheduler in order)."""
        if not outcome.bad_checkpoint:
            return False
        if not self._drop_bad_checkpoint(outcome.bad_checkpoint, outcome.error):
            return False
        self.by_id[outcome.trial_id].trial.status = TrialStatus.PENDING
        return True

    def _on_error(self, rec: TrialRecord, outcome: SegmentOutcome) -> None:
        for ckpt in outcome.checkpoints:  # never committed: nobody can refer to them
            self.storage.remove(rec.checkpoint_path(ckpt.name))
        # a trainable parked after a segment whose results were refused has trained past
        # them: a retry must start from the checkpoint, not go on from there
        self._discard_live(rec)
        if self._falls_back(outcome):
            return
        rec.num_failures += 1
        max_failures = self.spec.max_failures
        if outcome.lost_worker and max_failures >= 0:  # a process may die of other causes
            max_failures = max(max_failures, LOST_WORKER_RETRIES)
        if max_failures < 0 or rec.num_failures <= max_failures:
            self.retries.failed(
                rec.trial_id, rec.num_failures, max_failures, outcome.error, rec.restore
            )
            rec.trial.status = TrialStatus.PENDING
            self.hooks.trial_recover(rec.trial)
            return
        for result in outcome.results:
            self._record(rec, result)
        rec.error = outcome.error
        self.table.fail(rec.trial)
        self._check_lease()
        self.storage.write_text(outcome.error or "", rec.dirname, ERROR_FILE)
        self._events.append(f"[error] {rec.trial_id}")
        run_logger().error("trial %s errored: %s", rec.trial_id, last_line(outcome.error))
        logger.debug("trial %s errored:\n%s", rec.trial_id, outcome.error)
        self.hooks.trial_error(rec.trial)
        self.early_end.errored(rec)

    def _stop_all(self) -> None:
        """End every live trial where it stands (:mod:`popflow.flows.driver.early_end`)."""
        self.calls.cancel()  # segments in flight: their results are not taken
        stopped = [r for r in self.records if r.trial.is_live]
        for rec in stopped:
            rec.trial.status = TrialStatus.TERMINATED
            self.scheduler.on_trial_remove(rec.trial)
            self._discard_live(rec)
            self.hooks.trial_complete(rec.trial)
        why = self.early_end.why
        self._events.append(f"[stopped] {why}; {len(stopped)} trials stopped")
        logger.warning("%s; stopping the experiment (%d trials stopped)", why, len(stopped))

    def _out_of_time(self) -> bool:
        """The run's budget is spent (``time_budget_s``, ``max_rounds``): cancel what
        runs, commit, end the run (not the experiment: its trials wait, as last
        committed, for a resume)."""
        self.early_end.end_of_budget()
        self.calls.cancel()
        waiting = 0
        for rec in self.records:
            if rec.trial.status == TrialStatus.RUNNING:
                rec.trial.status = TrialStatus.PENDING
                self._discard_live(rec)
            waiting += rec.trial.is_live
        self._events.append(f"[budget] {self.early_end.budget} spent; {waiting} trials wait")
        self._flush_discards()
        self.hooks.step_end()
        self.commit(final=True)
        return False

    def _drop_bad_checkpoint(self, path: str, error: str | None) -> bool:
        """Stop using a checkpoint that failed its check (False: no earlier one to use)."""
        reason = last_line(error)
        fallback = fall_back_from(self.records, path)
        self.index.touch_all()  # any trial may have restored from that checkpoint
        if fallback is None:
            logger.error("checkpoint %s is corrupt and no earlier one exists: %s", path, reason)
            return False
        self._events.append(f"[corrupt checkpoint] {path}; using {fallback}")
        logger.error(
            "checkpoint %s failed its check (%s); falling back to %s", path, reason, fallback
        )
        return True
