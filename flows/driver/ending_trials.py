"""How a run's trials end other than by finishing: a trial's error (retried or for
good), a checkpoint that failed its check, the experiment stopped early, the run's
budget spent.

:class:`TrialEndings` is the driver's collaborator for those ends: it works on the
driver's state through :class:`RoundState` (what it reads and calls, typed), and says
what happened on the driver's event bus.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from popflow.flows.driver.backend import Backend
from popflow.flows.driver.early_end import EarlyEnd
from popflow.flows.driver.guards import Retries, raise_storage_failure
from popflow.flows.driver.trial_index import TrialIndex
from popflow.flows.events.callbacks import Hooks
from popflow.flows.events.run_events import EventBus, TrialErrored
from popflow.flows.experiment.fallback import fall_back_from, rebuild_again, rebuilt
from popflow.flows.experiment.results import latest_checkpoint
from popflow.flows.experiment.trial_table import TrialRecord, TrialTable
from popflow.infra.storage.folder import Storage
from popflow.infra.store.layout import ERROR_FILE
from popflow.schedulers import TrialScheduler, TrialStatus
from popflow.tasks.specs import EndReason, SegmentOutcome

if TYPE_CHECKING:
    from popflow.flows.spec.run_spec import RunSpec

logger = logging.getLogger(__name__)

#: A trial whose worker process died while it ran there alone is retried at least this
#: often, whatever ``max_failures`` says: the kernel's OOM killer, a preempted machine
#: or a signal from outside end a process too, and a one-off is no reason to error.
LOST_WORKER_RETRIES = 2


def last_line(text: str | None) -> str:
    r"""A trace's last line: the one-line reason.

    >>> last_line("Traceback ...\n  File x\nValueError: bad lr\n")
    'ValueError: bad lr'
    """
    lines = (text or "").strip().splitlines()
    return lines[-1] if lines else "?"


class RoundState(Protocol):
    """What of the driver's state the trials' ends read and change."""

    spec: RunSpec
    storage: Storage
    records: list[TrialRecord]
    by_id: dict[str, TrialRecord]
    retries: Retries
    hooks: Hooks
    table: TrialTable
    backend: Backend
    scheduler: TrialScheduler
    early_end: EarlyEnd
    index: TrialIndex
    events: EventBus
    notes: list[str]  # the round's events, committed with it

    def record(self, rec: TrialRecord, result: dict[str, Any]) -> bool: ...
    def check_lease(self) -> None: ...
    def discard_live(self, rec: TrialRecord) -> None: ...
    def flush_discards(self) -> None: ...
    def commit(self, final: bool = False) -> None: ...


class TrialEndings:
    def __init__(self, state: RoundState) -> None:
        self.state = state
        #: checkpoints found damaged and dropped (each once, whichever trial found it)
        self._dropped: set[str] = set()

    def pending(self, trial_id: str) -> bool:
        return self.state.by_id[trial_id].trial.status == TrialStatus.PENDING

    def await_retry(self) -> bool:
        """Nothing runs, but a failed trial waits out its backoff: sleep until it may
        run again (True), or False if none waits."""
        waits = self.state.retries.waiting(self.pending)
        if not waits:
            return False
        clock = self.state.backend.clock
        clock.sleep(max(0.0, min(waits) - clock.monotonic()))
        return True

    def falls_back(self, outcome: SegmentOutcome) -> bool:
        """The segment could not restore: its checkpoint failed its check. True if an
        earlier one is used instead (storage's fault, not the trial's: it runs again, in a
        synchronous round within the round, so results reach the scheduler in order)."""
        path = outcome.bad_checkpoint
        if not path:
            return False
        rec = self.state.by_id[outcome.trial_id]
        if path not in self._dropped:  # once: in a synchronous round it is asked again
            self._drop_bad_checkpoint(path, outcome.error)
        if rec.restore == path and rec.rebuild is None:
            return False  # nothing to go back to: it cannot go on
        rec.trial.status = TrialStatus.PENDING
        return True

    def rebuilt(self, outcome: SegmentOutcome) -> bool:
        """A rebuild's segment returned (the state a trial's exploit cloned, made again:
        :class:`~popflow.flows.experiment.trial_table.Rebuild`). Its results are the
        source's, run again: never logged. True if it is settled here: the trial goes
        on from the state it made, or from a rebuild that starts further back (its
        start was damaged too); False for an error the trial's own rules handle."""
        s = self.state
        rec = s.by_id[outcome.trial_id]
        if not rec.rebuilding:
            return False
        rec.rebuilding = False
        s.index.touch(rec)
        raise_storage_failure(outcome)
        if outcome.live_token and outcome.worker:  # it holds the source's config
            rec.live = (outcome.live_token, outcome.worker)
            s.discard_live(rec)
        outcome.live_token = outcome.worker = None
        results, outcome.results = outcome.results, []
        rebuild, bad, outcome.bad_checkpoint = rec.rebuild, outcome.bad_checkpoint, None
        if rebuild is None:  # it went on from the cloned state meanwhile (a worker's copy)
            for ckpt in outcome.checkpoints:
                s.storage.remove(rec.checkpoint_path(ckpt.name))
            rec.trial.status = TrialStatus.PENDING
            return True
        made = next((c for c in outcome.checkpoints if c.iteration == rebuild.through), None)
        if outcome.reason != EndReason.ERROR and made is not None:
            for ckpt in outcome.checkpoints:
                if ckpt is not made:
                    s.storage.remove(rec.checkpoint_path(ckpt.name))
            rebuilt(rec, made)
            rec.trial.checkpoint = latest_checkpoint(s.storage, rec)
            s.notes.append(
                f"[rebuilt] {rec.trial_id}: the state it cloned at iteration {rebuild.through}"
            )
            rec.trial.status = TrialStatus.PENDING
            return True
        if bad and bad == rebuild.restore:
            if bad not in self._dropped:
                self._drop_bad_checkpoint(bad, outcome.error)
            if rebuild_again(s.records, rec):
                rec.trial.status = TrialStatus.PENDING
                return True
        elif outcome.reason != EndReason.ERROR:  # deterministic code ran differently
            reached = results[-1].get("training_iteration") if results else rebuild.iteration
            outcome.reason = EndReason.ERROR
            outcome.error = (
                f"making again the state trial {rec.trial_id} cloned at iteration "
                f"{rebuild.through}: the source's training ended at iteration {reached}"
            )
        return False

    def on_error(self, rec: TrialRecord, outcome: SegmentOutcome) -> None:
        s = self.state
        if outcome.checkpoints:  # a driver taken over stops here, deleting nothing
            s.check_lease()
        for ckpt in outcome.checkpoints:  # published, never committed: nobody refers to them
            s.storage.remove(rec.checkpoint_path(ckpt.name))
        # a trainable parked after a segment whose results were refused has trained past
        # them: a retry must start from the checkpoint, not go on from there
        s.discard_live(rec)
        if self.falls_back(outcome):
            return
        rec.num_failures += 1
        max_failures = s.spec.max_failures
        if outcome.lost_worker and max_failures >= 0:  # a process may die of other causes
            max_failures = max(max_failures, LOST_WORKER_RETRIES)
        if max_failures < 0 or rec.num_failures <= max_failures:
            s.retries.failed(
                rec.trial_id, rec.num_failures, max_failures, outcome.error, rec.restore
            )
            rec.trial.status = TrialStatus.PENDING
            s.hooks.trial_recover(rec.trial)
            return
        for result in outcome.results:
            s.record(rec, result)
        rec.error = outcome.error
        s.table.fail(rec.trial)
        s.check_lease()
        s.storage.write_text(outcome.error or "", rec.dirname, ERROR_FILE)
        rec.trial.error_file = s.storage.full_url(rec.dirname, ERROR_FILE)
        s.notes.append(f"[error] {rec.trial_id}")
        s.events.emit(TrialErrored(rec, outcome.error or "", last_line(outcome.error)))
        logger.debug("trial %s errored:\n%s", rec.trial_id, outcome.error)
        s.hooks.trial_error(rec.trial)
        s.early_end.errored(rec)

    def stop_all(self) -> None:
        """End every live trial where it stands (:mod:`popflow.flows.driver.early_end`)."""
        s = self.state
        s.backend.cancel()  # segments in flight: their results are not taken
        stopped = [r for r in s.records if r.trial.is_live]
        for rec in stopped:
            rec.trial.status = TrialStatus.TERMINATED
            s.scheduler.on_trial_remove(rec.trial)
            s.discard_live(rec)
            s.hooks.trial_complete(rec.trial)
        why = s.early_end.why
        s.notes.append(f"[stopped] {why}; {len(stopped)} trials stopped")
        logger.warning("%s; stopping the experiment (%d trials stopped)", why, len(stopped))

    def out_of_time(self) -> bool:
        """The run's budget is spent (``time_budget_s``, ``max_rounds``): cancel what
        runs, commit, end the run (not the experiment: its trials wait, as last
        committed, for a resume)."""
        s = self.state
        s.early_end.end_of_budget()
        s.backend.cancel()
        waiting = 0
        for rec in s.records:
            if rec.trial.status == TrialStatus.RUNNING:
                rec.trial.status = TrialStatus.PENDING
            s.discard_live(rec)  # a trainable parked at the budget's end: no run continues it
            waiting += rec.trial.is_live
        s.notes.append(f"[budget] {s.early_end.budget} spent; {waiting} trials wait")
        s.flush_discards()
        s.hooks.step_end()
        s.commit(final=True)
        return False

    def _drop_bad_checkpoint(self, path: str, error: str | None) -> bool:
        """Stop using a checkpoint that failed its check (False: no earlier one to use)."""
        self._dropped.add(path)
        reason = last_line(error)
        fallback = fall_back_from(self.state.records, path)
        self.state.index.touch_all()  # any trial may have restored from that checkpoint
        if fallback is None:
            logger.error("checkpoint %s is corrupt and no earlier one exists: %s", path, reason)
            return False
        self.state.notes.append(f"[corrupt checkpoint] {path}; using {fallback}")
        logger.error(
            "checkpoint %s failed its check (%s); falling back to %s", path, reason, fallback
        )
        return True
