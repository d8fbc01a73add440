"""The reduce step of the driver's round
(:class:`~popflow.flows.driver.controller.Controller` inherits it): a returned segment's
results are logged and told to the scheduler in a fixed order (trial order), its
decisions change the trial table, and an exploit clones one trial's checkpoint and
config into another.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from popflow.flows.driver.guards import raise_storage_failure, result_problem
from popflow.flows.driver.segment_cuts import ask_to_save
from popflow.flows.events.run_events import Decided, Exploited, SegmentReturned, TrialResult
from popflow.flows.experiment.results import checkpoint_of, latest_checkpoint
from popflow.flows.experiment.trial_table import TrialRecord, clone_into, results_through
from popflow.schedulers import Action, Exploit, Trial, TrialStatus
from popflow.tasks.specs import EndReason, SegmentOutcome
from popflow.tasks.trainable import saves_checkpoints

if TYPE_CHECKING:
    from popflow.flows.driver.controller import Controller

logger = logging.getLogger(__name__)


class RoundReduction:
    """Reduce steps, on the controller's state."""

    # -- reduce ----------------------------------------------------------------
    def _reduce_all(self: Controller, outcomes: list[SegmentOutcome]) -> None:
        for outcome in sorted(outcomes, key=lambda o: self.by_id[o.trial_id].index):
            self._reduce(outcome)

    def record(self: Controller, rec: TrialRecord, result: dict[str, Any]) -> bool:
        """One result of ``rec``'s trial: logged, told to the callbacks and subscribers;
        whether a callback asked for a checkpoint at it (``should_checkpoint``)."""
        result["config"] = rec.trial.config  # as Ray: the config this result was trained with
        rec.num_results += 1
        rec.trial.last_result = result
        self.logs.add_result(rec, result)
        asked = self.hooks.trial_result(rec.trial, result)
        self.events.emit(TrialResult(rec, result))
        return asked

    def _reduce(self: Controller, outcome: SegmentOutcome) -> None:
        self.attempts.returned(outcome)  # before anything turns it into an error
        if self.endings.rebuilt(outcome):  # the state an exploit cloned, made again
            return
        rec = self.by_id[outcome.trial_id]
        self.index.touch(rec)
        self.events.emit(SegmentReturned(rec.trial_id))
        rec.live = (
            (outcome.live_token, outcome.worker) if outcome.live_token and outcome.worker else None
        )
        raise_storage_failure(outcome)  # the storage's fault, not the trial's: the run stops
        if outcome.restored and rec.restore_results is not None:
            rec.replay_after_rewind()
            self.logs.rewind(rec, rec.restore_results)  # results are logged once, in order
        # the trainable's own error (not its results'): what it saved before is kept
        own_error = outcome.reason == EndReason.ERROR
        if outcome.reason != EndReason.ERROR:
            keys = [k for k in (self.scheduler.metric, self.scheduler.time_attr) if k]
            scheduler = type(self.scheduler).__name__
            problem = result_problem(outcome.trial_id, outcome.results, keys, scheduler)
            if problem is not None:
                outcome.reason, outcome.error = EndReason.ERROR, problem
            else:
                self.missing_metric.look(outcome.trial_id, outcome.results)
        if outcome.reason == EndReason.ERROR:
            if own_error and self._keep_before_error(rec, outcome):
                return
            self.endings.on_error(rec, outcome)
            return
        self.retries.succeeded(rec.trial_id)
        rec.checkpoints.extend(outcome.checkpoints)
        if outcome.checkpoints:
            rec.trial.checkpoint = latest_checkpoint(self.storage, rec)
        if self.hooks:
            for ckpt in outcome.checkpoints:
                self.hooks.checkpoint(rec.trial, checkpoint_of(self.storage, rec, ckpt.name))
        rec.restore_from(outcome.checkpoints, outcome.results)
        terminal = outcome.reason.is_terminal
        action = Action.CONTINUE
        asked = False  # a callback asked for a checkpoint
        for i, result in enumerate(outcome.results):
            asked = self.record(rec, result) or asked
            if rec.replays(result):  # decided on before the trial was sent back
                continue
            if self.early_end.stops(rec.trial_id, result):
                dropped = len(outcome.results) - i - 1
                if dropped:
                    logger.debug(
                        "trial %s stopped; dropping %d later results", rec.trial_id, dropped
                    )
                terminal = True
                break
            if terminal and i == len(outcome.results) - 1:
                break  # Ray: a result meeting a stop condition goes to on_trial_complete only
            decision = self.table.report(rec.trial, result)
            self.events.emit(Decided(rec.trial_id, result, decision))
            action = decision.action
            if action == Action.STOP:
                dropped = len(outcome.results) - i - 1
                if dropped:
                    logger.debug(
                        "trial %s stopped; dropping %d later results", rec.trial_id, dropped
                    )
                break
        if rec.restore_results is not None:  # results dropped after a stop
            rec.restore_results = min(rec.restore_results, rec.num_results)
        if asked:
            ask_to_save(rec, outcome, ended=terminal or action == Action.STOP)
        self.table.end_segment(rec.trial, action, terminal)
        if self.suggestions is not None and rec.trial.status == TrialStatus.PAUSED:
            self.suggestions.paused(rec.trial_id)
        # a class trainable that cannot save keeps its state only live: a trial that yields
        # (median stopping) keeps it, rather than train again from scratch when it resumes
        keeps = self.scheduler.pause_is_barrier or not saves_checkpoints(self.spec.trainable)
        held = rec.trial.status == TrialStatus.PAUSED and keeps
        if rec.trial.status != TrialStatus.PENDING and not held:
            self.discard_live(rec)  # paused for long or ended: free the worker's memory

    def _keep_before_error(self: Controller, rec: TrialRecord, outcome: SegmentOutcome) -> bool:
        """A segment that errored had published checkpoints: as Ray, they and the results
        up to the newest are kept (logged, decided on) and a retry restores from it. The
        later results go with the error. True if a decision ended the trial meanwhile."""
        if not outcome.checkpoints or outcome.bad_checkpoint:
            return False
        self.check_lease()  # a driver taken over commits nothing
        checkpoints, outcome.checkpoints = outcome.checkpoints, []
        count = results_through(outcome.results, checkpoints[-1].iteration)
        kept, outcome.results = outcome.results[:count], outcome.results[count:]
        rec.checkpoints.extend(checkpoints)
        rec.trial.checkpoint = latest_checkpoint(self.storage, rec)
        if self.hooks:
            for ckpt in checkpoints:
                self.hooks.checkpoint(rec.trial, checkpoint_of(self.storage, rec, ckpt.name))
        rec.restore_from(checkpoints, kept)
        for result in kept:
            self.record(rec, result)
            if rec.replays(result):
                continue
            stopped = self.early_end.stops(rec.trial_id, result)
            if not stopped:
                decision = self.table.report(rec.trial, result)
                self.events.emit(Decided(rec.trial_id, result, decision))
                stopped = decision.action == Action.STOP
            if stopped:  # in Ray it would have ended before it failed
                self.table.end_segment(rec.trial, Action.STOP, True)
                self.discard_live(rec)
                return True
        return False

    def _exploit(self: Controller, exploit: Exploit, reporter: Trial | None) -> None:
        target, source = self.by_id[exploit.trial_id], self.by_id[exploit.source_trial_id]
        if target.trial.status == TrialStatus.RUNNING and target.trial is not reporter:
            logger.warning("not exploiting into running trial %s", target.trial_id)
            return
        if source.restore is None:
            logger.warning(
                "%s has no checkpoint yet; %s keeps its own state", source.trial_id, target.trial_id
            )
            return
        if source is not target:
            self.discard_live(target)  # its state is replaced by the clone
        self.logs.add_exploit(clone_into(target, source, exploit), target)
        self.index.touch(target)
        brief, line = exploit.brief(), exploit.describe()
        self.notes.append(brief)
        self._decisions.append(line)  # the round task logs it, once
        self.events.emit(Exploited(target.trial_id, source.trial_id, brief, line))
