"""The round loop behind ``popflow.run``: plan, dispatch, reduce, commit (each step's
methods in its module, which the :class:`Controller` inherits).

- plan (:mod:`~popflow.flows.driver.dispatch_steps`): the scheduler picks runnable trials
  (``choose_trial_to_run``) and says how far each may run (``next_milestone``);
- dispatch (the same module): segments run on a
  :class:`~popflow.flows.driver.backend.Backend` (runner actors on a Dask cluster, or a
  simulation on a virtual clock);
- reduce (:mod:`~popflow.flows.driver.reduce_steps`): results go to the scheduler in a
  fixed order; its decisions change the trial table
  (:mod:`popflow.flows.experiment.trial_table`);
- commit (:mod:`~popflow.flows.driver.commit_steps`): results, derived logs (:mod:`popflow.flows.experiment.trial_logs`) and the
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

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from popflow.flows.driver.attempts import Attempts
from popflow.flows.driver.backend import Backend
from popflow.flows.driver.commit_steps import RoundCommits
from popflow.flows.driver.dispatch_steps import RoundDispatch
from popflow.flows.driver.early_end import GRACE_S, EarlyEnd
from popflow.flows.driver.ending_trials import TrialEndings
from popflow.flows.driver.guards import MissingMetric, Retries
from popflow.flows.driver.packing import packs, spread
from popflow.flows.driver.pipelined_commit import PreparedCommit, Publishing, RoundLost
from popflow.flows.driver.reduce_steps import RoundReduction
from popflow.flows.driver.retention import Janitor
from popflow.flows.driver.suggestions import Suggestions
from popflow.flows.driver.trial_index import TrialIndex
from popflow.flows.events.callbacks import Hooks
from popflow.flows.events.run_events import EventBus, RoundBegan, RunEnded, Tick
from popflow.flows.experiment import round_history
from popflow.flows.experiment.new_trials import new_record
from popflow.flows.experiment.trial_logs import TrialLogs
from popflow.flows.experiment.trial_table import TrialRecord, TrialTable
from popflow.schedulers import Trial
from popflow.tasks.seeding import DRIVER, seed_globals, segment_seed
from popflow.tasks.specs import EndReason, SegmentOutcome

if TYPE_CHECKING:  # types only: the driver runs on what the doors built
    from popflow.flows.experiment.opening import Experiment
    from popflow.flows.spec.run_spec import RunSpec


class Controller(RoundDispatch, RoundReduction, RoundCommits):
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
        attempts: Attempts | None = None,
    ) -> None:
        self.spec = spec
        self.records = experiment.records
        self.by_id = {r.trial_id: r for r in self.records}
        self.by_dir = {r.dirname: r for r in self.records}
        self.index = TrialIndex(self.records)
        self.scheduler = spec.scheduler
        self.storage = experiment.storage  # the experiment's folder
        for r in self.records:  # for callbacks (Ray's Trial.path, checkpoint, ...)
            self._attach(r)
        self.log = experiment.log
        self.backend = backend
        self.clock = backend.clock
        self.events = events if events is not None else EventBus()
        self.progress_topic = progress_topic
        self.seed = experiment.seed
        self.lease = experiment.lease
        resumed = experiment.resumed_from or {}
        self.rounds: int = resumed.get("round", 0)
        self.began: float | None = None  # when the round in progress began
        self.history: list[Any] = list(resumed.get(round_history.KEY) or [])
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
            lease_check=self.lease.check if self.lease is not None else None,
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
        #: the trials' segment attempts in this epoch (a controller after a lost round in
        #: the same epoch goes on with its predecessor's)
        self.attempts = attempts if attempts is not None else Attempts()
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
        self.began = self.clock.time()
        self.events.emit(RoundBegan(self.rounds, self.began))
        self.hooks.step_begin()
        self.backend.refresh()
        if self.scheduler.synchronous:
            outcomes: list[SegmentOutcome] = []
            while True:
                planned = self._plan(limit=None)
                slots = self.backend.slots
                size = math.ceil(len(planned) / slots) if planned else 1
                later = [
                    rest
                    for pack in spread(packs(planned, size, self.backend.isolated), slots)
                    if (rest := self._dispatch_now(pack)) is not None
                ]
                self._write_prepared()  # the last round's commit, as this one trains
                for pack, placement in later:
                    self._dispatch(pack, placement)
                if not self.backend:
                    if not outcomes and self.endings.await_retry():
                        continue
                    break
                # a synchronous round cut short by run_budget_s runs again on resume: a
                # segment ended at its end is not taken (its publishes are not waited for)
                cut = self.early_end.run_budget_first
                outcomes.extend(
                    self._taken_back([o for o in self._returned() if not (cut and o.at_deadline)])
                )
                if self.backend and self.early_end.timed_out():  # the experiment ends
                    for returned in self._winding_down():
                        outcomes.extend(self._taken_back(returned))
                    break
                if (self.backend or self.early_end.cut_short) and self.early_end.over_budget():
                    return self.endings.out_of_time()  # the round runs again on resume
            if not outcomes and not self.early_end.due:
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
                # after the dispatch, not the reduce: the console shows the slots refilled
                self.events.emit(Tick(self.records, self.rounds))
                if not self.backend:
                    if self.endings.await_retry():
                        continue
                    break
                self._reduce_all(self._returned())
                if self.early_end.cut_short:
                    self._keep_what_ends_at_the_budget()
                    return self.endings.out_of_time()
                if self.backend and self.early_end.timed_out():  # the experiment ends
                    for returned in self._winding_down():
                        self._reduce_all(returned)
                    break
                if self.clock.monotonic() >= deadline or self.early_end.due:
                    break
                if self.early_end.over_budget():
                    break
        self.early_end.check()
        self.early_end.round_done()
        if self.early_end.due:
            self.endings.stop_all()
        elif self._more() and self.early_end.over_budget():
            # here, not in the loop: a round may end at its commit interval as the budget does
            self._keep_what_ends_at_the_budget()
            return self.endings.out_of_time()
        self.flush_discards()
        self.hooks.step_end()
        more = self._more()
        self.commit(final=not more, hold=more and self._pipelining)
        return more

    def _returned(self) -> list[SegmentOutcome]:
        """What the backend returns, waiting no later than a budget's end. A segment that
        ended at ``run_budget_s``'s end (sent with it) is taken, its trial going on next
        run (what it reported and saved is kept: a segment longer than the budget still
        makes progress run after run), and puts the run over its budget even where the
        driver's clock is not there yet (:attr:`EarlyEnd.cut_short`)."""
        return self._at_run_budget(self.backend.returned(self.early_end.wake_at()))

    def _at_run_budget(self, returned: list[SegmentOutcome]) -> list[SegmentOutcome]:
        """``returned``, where a segment ended at ``run_budget_s``'s end goes on next run
        (a decision point, not a stop that ends its trial)."""
        if not self.early_end.run_budget_first:
            return returned  # Ray's budget: a segment's end at it is the trial's end
        for outcome in returned:
            if outcome.at_deadline:  # the run's end, not the trial's: it goes on next run
                outcome.reason = EndReason.MILESTONE
                self.early_end.reached_by_worker()
        return returned

    def _taken_back(self, returned: list[SegmentOutcome]) -> list[SegmentOutcome]:
        """A synchronous round's returned outcomes, less rebuilds and fallbacks (settled
        here: they are not reduced)."""
        for outcome in returned:
            self.attempts.returned(outcome)
        self.publishing.note(returned, self.by_id)
        return [
            o for o in returned if not self.endings.rebuilt(o) and not self.endings.falls_back(o)
        ]

    def _keep_what_ends_at_the_budget(self) -> None:
        """``run_budget_s`` has passed (asynchronous scheduling): the segments in flight were
        sent with its end and stop at their next report; what they reported and saved is
        kept (a segment longer than the budget still makes progress run after run) if they
        return within :data:`~popflow.flows.driver.early_end.GRACE_S`. A stop asked from
        outside or ``max_rounds`` does not wait (the segments were not sent with it)."""
        if not self.early_end.run_budget_reached():
            return
        for returned in self._winding_down():
            self._reduce_all(returned)

    def _winding_down(self) -> Iterator[list[SegmentOutcome]]:
        """A budget has passed: what the segments in flight return as they
        end at their next report (each was sent with the deadline), for up to
        :data:`~popflow.flows.driver.early_end.GRACE_S`; what is still in flight then is
        cancelled by the experiment's end (:meth:`TrialEndings.stop_all`)."""
        until = self.clock.monotonic() + GRACE_S
        while self.backend and self.clock.monotonic() < until:
            yield self._at_run_budget(self.backend.returned(until))

    def _more(self) -> bool:
        """Work remains: segments in flight, trials to run, or retries waiting (with a
        search algorithm, one more ask when nothing is live: it may have more)."""
        ended = self.early_end.due  # the experiment's end: its searcher suggests no more
        if self.suggestions is not None and not self.index.live and not self.backend and not ended:
            self._suggest()
        return (
            bool(self.backend)
            or bool(self._runnable())
            or bool(self.retries.waiting(self.endings.pending))
        )

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
            self.attempts.reopen_all()  # its publishes were never settled
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
