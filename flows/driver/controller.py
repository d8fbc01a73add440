"""The round loop behind ``popflow.run``: plan, dispatch, reduce, commit.

- plan: the scheduler picks runnable trials (``choose_trial_to_run``) and
  says how far each may run (``next_milestone``);
- dispatch: segments run on a :class:`~popflow.flows.driver.backend.Backend` (runner
  actors on a Dask cluster, or a simulation on a virtual clock);
- reduce: results go to the scheduler in a fixed order; its decisions change
  the trial table (:mod:`popflow.flows.experiment.trial_table`);
- commit: results, derived logs (:mod:`popflow.flows.experiment.trial_logs`) and the
  full state are written to storage before the next round starts (on an object
  store, a synchronous round's commit is written while the next round's first
  segments train: :mod:`popflow.flows.driver.pipelined_commit`); retired
  checkpoints go after it (:mod:`popflow.flows.driver.retention`).

Synchronous schedulers (synch PBT, HyperBand) get a barrier per round and
see results in trial order, so a seeded run is reproducible whatever the
worker count. Asynchronous ones decide per result as segments finish and
dispatch the next segment at once; their commits are grouped per
``commit_interval`` seconds.

The driver imports no console, Prefect, plots or Dask (an import-linter contract): what
happened goes out as events (:mod:`popflow.flows.events.run_events`) to whoever
subscribed, and time is read from the backend's clock.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from popflow.flows.driver.backend import Backend, Placement
from popflow.flows.driver.commit_steps import RoundCommits
from popflow.flows.driver.early_end import EarlyEnd
from popflow.flows.driver.ending_trials import TrialEndings
from popflow.flows.driver.guards import (
    MissingMetric,
    Retries,
    raise_storage_failure,
    result_problem,
)
from popflow.flows.driver.packing import pack_size, packs
from popflow.flows.driver.pipelined_commit import (
    PreparedCommit,
    Publishing,
    RoundLost,
    split_pending,
)
from popflow.flows.driver.retention import Janitor
from popflow.flows.driver.segment_cuts import ask_to_save, cut
from popflow.flows.driver.suggestions import Suggestions
from popflow.flows.driver.trial_index import TrialIndex, started
from popflow.flows.events.callbacks import Hooks
from popflow.flows.events.run_events import (
    Decided,
    EventBus,
    Exploited,
    RoundBegan,
    RunEnded,
    SegmentReturned,
    Tick,
    TrialResult,
    TrialStarted,
)
from popflow.flows.experiment.new_trials import new_record, trial_id_of
from popflow.flows.experiment.results import checkpoint_of
from popflow.flows.experiment.trial_logs import TrialLogs
from popflow.flows.experiment.trial_table import (
    TrialRecord,
    TrialTable,
    clone_into,
    restore_digest,
)
from popflow.schedulers import Action, Exploit, Trial, TrialStatus
from popflow.tasks.seeding import DRIVER, seed_globals, segment_seed
from popflow.tasks.specs import EndReason, SegmentOutcome, SegmentSpec

if TYPE_CHECKING:  # types only: the driver runs on what the doors built
    from popflow.flows.experiment.opening import Experiment
    from popflow.flows.spec.run_spec import RunSpec

logger = logging.getLogger(__name__)


class Controller(RoundCommits):
    """Runs ``experiment``'s rounds on ``backend``; says what happened on ``events``.

    ``progress_topic``: where running segments send their latest result as they train
    (the console's live rows; None: nowhere). ``pipeline_after``: rounds up to this one
    commit before the next starts, whatever the storage (the door's choice after a
    :class:`~popflow.flows.driver.pipelined_commit.RoundLost`).
    """

    def __init__(
        self,
        spec: RunSpec,
        experiment: Experiment,
        backend: Backend,
        events: EventBus | None = None,
        progress_topic: str | None = None,
        pipeline_after: int = 0,
    ) -> None:
        self.spec = spec
        self.records = experiment.records
        self.by_id = {r.trial_id: r for r in self.records}
        self.by_dir = {r.dirname: r for r in self.records}
        self.index = TrialIndex(self.records)
        for r in self.records:  # for callbacks that write beside a trial (Ray's Trial.path)
            r.trial.path = experiment.storage.full_url(r.dirname)
        self.scheduler = spec.scheduler
        self.storage = experiment.storage  # the experiment's folder
        self.log = experiment.log
        self.backend = backend
        self.clock = backend.clock
        self.events = events if events is not None else EventBus()
        self.progress_topic = progress_topic
        self.seed = experiment.seed
        self.lease = experiment.lease
        resumed = experiment.resumed_from or {}
        self.rounds: int = resumed.get("round", 0)
        self.hooks = Hooks(spec.callbacks, lambda: self.rounds, lambda: self.trials)
        self.hooks.set_state(resumed.get("callbacks"))
        self.table = TrialTable(
            self.scheduler,
            (r.trial for r in self.records),
            exploit=self._exploit,
            leave=lambda trial: self.discard_live(self.by_id[trial.trial_id]),
            before_call=self._seed_user_code,
            ended=self.hooks.trial_complete,
        )
        self.decisions: int = resumed.get(
            "decisions", 0
        )  # scheduler calls: seed the driver's globals
        self.logs = TrialLogs(
            self.storage,
            spec.log_flush_interval,
            log_policy=self.scheduler.logs_policy,
            derived=resumed.get("derived"),
            policy_total=resumed.get("policy_total", 0),
            may_write=self.lease.guard() if self.lease is not None else None,
        )
        self.janitor = Janitor(self.storage)
        #: a synchronous round on an object store commits while the next one trains
        self.pipelined = (
            self.scheduler.synchronous and not self.storage.is_local and backend.defers_publishes
        )
        self.pipeline_after = pipeline_after
        self.publishing = Publishing()  # checkpoints returned calls are still publishing
        self.prepared: PreparedCommit | None = None  # the last round's, to write
        backend.on_wait = self._while_waiting
        self._clock = max((r.trial.last_train_time for r in self.records), default=0.0)
        self.notes: list[str] = []  # the round's events, committed with it
        self._decisions: list[str] = []  # the round's exploits in Ray's words, for its log
        self._discards: dict[str, list[str]] = {}  # worker address -> parked tokens to drop
        self.retries = Retries(self.clock)
        self.missing_metric = MissingMetric(self.scheduler.metric, type(self.scheduler).__name__)
        self.early_end = EarlyEnd(spec, resumed, self.clock)
        self.endings = TrialEndings(self)
        self.suggestions = (
            None
            if spec.search_alg is None
            else Suggestions(
                spec,
                self.seed,
                resumed,
                make=lambda index, config, tag: new_record(spec, index, config, tag),
                add=self._add_trial,
            )
        )
        self.hooks.search = self.suggestions
        self.hooks.setup(spec.stop, spec.num_samples, len(self.records))

    def _while_waiting(self) -> None:
        """While segments run: stop if the lease was lost; let time show passing."""
        if self.lease is not None:
            self.lease.check(fresh=False)
        self.events.emit(Tick(self.records, self.rounds))

    @property
    def trials(self) -> list[Trial]:
        return [r.trial for r in self.records]

    # -- plan ------------------------------------------------------------------
    def _runnable(self) -> Sequence[Trial]:
        """Trials the scheduler may choose now (not those waiting out a retry backoff;
        with ``max_concurrent_trials``, Ray's cap on trials started and not ended)."""
        return self.index.runnable(self.retries.ready, self.spec.max_concurrent_trials)

    def _suggest(self) -> None:
        """New trials from the run's search algorithm, while it has room for them."""
        if self.suggestions is not None:
            self.suggestions.fill(self.backend.slots, lambda n: trial_id_of(self.spec.name, n))

    def _add_trial(self, rec: TrialRecord) -> None:
        """A trial the search algorithm suggested joins the run."""
        if rec.dirname in self.by_dir:
            raise ValueError(f"`trial_dirname_creator` gave two trials the folder {rec.dirname!r}")
        self.records.append(rec)
        self.by_id[rec.trial_id] = rec
        self.by_dir[rec.dirname] = rec
        rec.trial.path = self.storage.full_url(rec.dirname)
        self.index.add(rec)
        self.table.trials[rec.trial_id] = rec.trial
        self.scheduler.on_trial_add(rec.trial)

    def _plan(self, limit: int | None) -> list[TrialRecord]:
        """Mark the trials the scheduler picks as running, up to ``limit`` in flight."""
        self._suggest()
        planned: list[TrialRecord] = []
        room = None if limit is None else limit - self.backend.running
        if room is not None and room <= 0:
            return planned
        for chosen in self.scheduler.choose_trials_to_run(self._runnable(), room):
            rec = self.by_id[chosen.trial_id]
            if not started(rec):
                self.logs.add_params(rec)
            if self.suggestions is not None:
                self.suggestions.started(rec.trial_id)
            self._clock += 1
            rec.trial.status = TrialStatus.RUNNING
            rec.trial.last_train_time = self._clock
            self.hooks.trial_start(rec.trial)
            self.events.emit(TrialStarted(rec))
            planned.append(rec)
        return planned

    def _spec(self, rec: TrialRecord) -> SegmentSpec:
        target = self.scheduler.next_milestone(rec.trial)
        freq = self.spec.checkpoint_config.checkpoint_frequency
        stopper = self.early_end.stopper
        cuts = cut(target, freq, stopper is not None, self.hooks.see_each_result)
        save_first, rec.save_first = rec.save_first, None  # asked for once
        return SegmentSpec(
            trainable=self.spec.trainable,
            trial_id=rec.trial_id,
            trial_dir=rec.dirname,
            trial_name=str(rec.trial),
            experiment_name=self.spec.name,
            config=rec.trial.config,
            storage=self.storage,
            seed=segment_seed(self.seed, rec.index, rec.start_iteration, rec.generation),
            restore=rec.restore,
            restore_digest=restore_digest(self.by_dir, rec.restore),
            time_attr=self.scheduler.time_attr,
            target=target,
            max_iterations=cuts.max_iterations,
            save_at_decisions=cuts.save_at_decisions,
            save_first=save_first,
            stop=None if stopper is not None else self.spec.stop,
            checkpoint_frequency=freq,
            checkpoint_at_end=self.spec.checkpoint_at_end,
            taken=frozenset(c.name for c in rec.checkpoints)
            | self.janitor.deleting(rec.dirname)
            | self._retiring(rec.dirname),
            live_token=rec.live[0] if rec.live else None,
            lease_epoch=self.lease.epoch if self.lease is not None else 0,
            progress_topic=self.progress_topic,
            defer_publish=self._pipelining,
        )

    @property
    def _pipelining(self) -> bool:
        return self.pipelined and self.rounds > self.pipeline_after

    def _pack_size(self, slots: int) -> int:
        return pack_size(self.backend.segment_seconds, self.index.live, slots)

    # -- dispatch --------------------------------------------------------------
    def _place(self, recs: list[TrialRecord]) -> Placement | None:
        # a synchronous round waits for its slowest slot: a pack that would queue behind
        # another on its trainables' worker goes to an idle runner (a worker that joined,
        # say) if their checkpoints hold their state; asynchronous PBT time-shares slots
        idle_first = self.scheduler.synchronous or self.scheduler.time_shares_slots
        return self.backend.place(recs, idle_first=idle_first)

    def _dispatch(self, recs: list[TrialRecord], placement: Placement | None = None) -> None:
        if placement is None:
            placement = self._place(recs)
        worker = placement.worker if placement is not None else None
        for rec in recs:
            if rec.live is not None and rec.live[1] != worker:
                self.discard_live(rec)  # it restores from its checkpoint there
        self.backend.submit(recs, [self._spec(r) for r in recs], placement)

    def _dispatch_now(
        self, pack: list[TrialRecord]
    ) -> tuple[list[TrialRecord], Placement | None] | None:
        """Send what of ``pack`` may start before the last round's publishes are settled;
        the rest and where it goes (:func:`split_pending`), to send after them."""
        if not self.publishing:
            self._dispatch(pack)
            return None
        placement = self._place(pack)
        worker = placement.worker if placement is not None else None
        now, later = split_pending(pack, worker, self.publishing)
        if now:
            self._dispatch(now, placement)
        return (later, placement if now else None) if later else None

    def run_round(self) -> bool:
        """Run one round; return True while work remains.

        Synchronous: every runnable trial runs, packed into one runner call
        per slot, then all results are reduced in trial order (a segment that
        must run again, its worker lost, runs again within the round).
        Asynchronous: up to ``2 * slots`` calls queued so no runner idles
        between a result and the next dispatch, each call one segment or, for
        short segments, a few; results are reduced as they arrive, for up to
        ``commit_interval`` seconds. A scheduler that time-shares the slots
        (asynchronous PBT) gets one call per slot instead, each trial chosen as
        a slot frees.
        """
        self.rounds += 1
        self.events.emit(RoundBegan(self.rounds, self.clock.time()))
        self.hooks.step_begin()
        self.backend.refresh()
        if self.scheduler.synchronous:
            outcomes: list[SegmentOutcome] = []
            while True:
                planned = self._plan(limit=None)
                size = math.ceil(len(planned) / self.backend.slots) if planned else 1
                later = [
                    rest
                    for pack in packs(planned, size, self.backend.isolated)
                    if (rest := self._dispatch_now(pack)) is not None
                ]
                self._write_prepared()  # the last round's commit, as this one trains
                for pack, placement in later:
                    self._dispatch(pack, placement)
                if not self.backend:
                    if not outcomes and self.endings.await_retry():
                        continue
                    break
                returned = self.backend.returned()
                self.publishing.note(returned, self.by_id)
                outcomes.extend(o for o in returned if not self.endings.falls_back(o))
                if self.backend and self.early_end.over_budget():
                    return self.endings.out_of_time()  # the round runs again on resume
            if not outcomes:
                return False
            self._reduce_all(outcomes)
        else:
            deadline = self.clock.monotonic() + self.spec.commit_interval
            while True:
                slots = self.backend.slots
                if self.scheduler.time_shares_slots:  # chosen as a slot frees: no queue
                    size, limit = 1, slots
                else:
                    size = self._pack_size(slots)
                    limit = 2 * slots * size
                for pack in packs(self._plan(limit=limit), size, self.backend.isolated):
                    self._dispatch(pack)
                if not self.backend:
                    if self.endings.await_retry():
                        continue
                    break
                self._reduce_all(self.backend.returned())
                self.events.emit(Tick(self.records, self.rounds))
                if self.clock.monotonic() >= deadline or self.early_end.due:
                    break
                if self.early_end.over_budget():
                    break
        self.early_end.check()
        self.early_end.round_done()
        if self.early_end.due:
            self.endings.stop_all()
        elif self._more() and self.early_end.over_budget():
            return self.endings.out_of_time()
        self.flush_discards()
        self.hooks.step_end()
        more = self._more()
        self.commit(final=not more, hold=more and self._pipelining)
        return more

    def _more(self) -> bool:
        """Work remains: segments in flight, trials to run, or retries waiting (with a
        search algorithm, one more ask when nothing is live: it may have more)."""
        if self.suggestions is not None and not self.index.live and not self.backend:
            self._suggest()
        return (
            bool(self.backend)
            or bool(self._runnable())
            or bool(self.retries.waiting(self.endings.pending))
        )

    # -- reduce ----------------------------------------------------------------
    def _reduce_all(self, outcomes: list[SegmentOutcome]) -> None:
        for outcome in sorted(outcomes, key=lambda o: self.by_id[o.trial_id].index):
            self._reduce(outcome)

    def record(self, rec: TrialRecord, result: dict[str, Any]) -> bool:
        """One result of ``rec``'s trial: logged, told to the callbacks and subscribers;
        whether a callback asked for a checkpoint at it (``should_checkpoint``)."""
        result["config"] = rec.trial.config  # as Ray: the config this result was trained with
        rec.num_results += 1
        rec.trial.last_result = result
        self.logs.add_result(rec, result)
        asked = self.hooks.trial_result(rec.trial, result)
        self.events.emit(TrialResult(rec, result))
        return asked

    def _reduce(self, outcome: SegmentOutcome) -> None:
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
        if outcome.reason != EndReason.ERROR:
            keys = [k for k in (self.scheduler.metric, self.scheduler.time_attr) if k]
            scheduler = type(self.scheduler).__name__
            problem = result_problem(outcome.trial_id, outcome.results, keys, scheduler)
            if problem is not None:
                outcome.reason, outcome.error = EndReason.ERROR, problem
            else:
                self.missing_metric.look(outcome.trial_id, outcome.results)
        if outcome.reason == EndReason.ERROR:
            self.endings.on_error(rec, outcome)
            return
        self.retries.succeeded(rec.trial_id)
        rec.checkpoints.extend(outcome.checkpoints)
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
        held = rec.trial.status == TrialStatus.PAUSED and self.scheduler.pause_is_barrier
        if rec.trial.status != TrialStatus.PENDING and not held:
            self.discard_live(rec)  # paused for long or ended: free the worker's memory

    def _seed_user_code(self) -> None:
        """Reseed the driver's global RNGs before a scheduler call.

        User callables such as ``lambda: random.uniform(...)`` in
        ``hyperparam_mutations`` draw from them; Prefect and Dask threads in this
        process may draw too, so a fixed stream per decision keeps runs repeatable.
        """
        self.decisions += 1
        seed_globals(segment_seed(self.seed, DRIVER, self.decisions))

    def discard_live(self, rec: TrialRecord) -> None:
        """Drop ``rec``'s parked trainable (at the round's end)."""
        if rec.live is not None:
            token, worker = rec.live
            self._discards.setdefault(worker, []).append(token)
            rec.live = None

    def flush_discards(self) -> None:
        for worker, tokens in self._discards.items():
            self.backend.discard_parked(worker, tokens)
        self._discards = {}

    def _exploit(self, exploit: Exploit, reporter: Trial | None) -> None:
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

    def drive(self, fresh: bool, one_round: Callable[[], bool] | None = None) -> None:
        """The whole run: round 0's commit if ``fresh`` (the sampled population, before any
        training), rounds until no work remains (``one_round``: a round and what its door
        does after it; default :meth:`run_round`), the seal; what is in flight is stopped
        and the backend closed however it ends."""
        if fresh:
            self.commit()
        lost = False
        try:
            while (one_round or self.run_round)():
                pass
            self.seal()
        except RoundLost:
            lost = True  # the backend stays: the door goes on from the last commit
            raise
        finally:
            self.cancel()
            if not lost:
                self.backend.close()

    def seal(self) -> None:
        """After the final commit: one more, so the checkpoints it retired can go and the
        logs a cut holds can be written (:class:`~popflow.flows.experiment.trial_logs.TrialLogs`)."""
        if self.janitor.pending or self.logs.holding:
            self.commit(final=True)
        self.events.emit(RunEnded(self.rounds, self.early_end.spent))

    def check_lease(self) -> None:
        if self.lease is not None:
            self.lease.check()

    # -- end -------------------------------------------------------------------
    def cancel(self) -> None:
        """Stop what is in flight and release every parked trainable."""
        self.backend.cancel()
        self.janitor.close()
        self.logs.close()
        self.index.close()
        for rec in self.records:
            self.discard_live(rec)
        self.flush_discards()
