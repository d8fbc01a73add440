"""A run's training, in the thread that called ``popflow.run``: open (or resume) the
experiment, run its rounds on the cluster, and say what happened on a
:class:`~popflow.flows.record.run_feed.RunFeed` for the Prefect record.

Nothing here waits for Prefect: the first segment starts as soon as the
cluster is up (:mod:`popflow.flows.record.prefect_flow` records the run as it goes).
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from distributed import Client

from popflow.flows.api.object_refs import objects_on_cluster
from popflow.flows.backends.dask_backend import DaskBackend
from popflow.flows.backends.dask_pool import RunnerPool
from popflow.flows.backends.storage_probe import StorageProbe
from popflow.flows.console.live_table import LiveTable, shown
from popflow.flows.console.verbose import DETAIL
from popflow.flows.driver.controller import Controller
from popflow.flows.driver.pipelined_commit import RoundLost
from popflow.flows.events.run_events import (
    Event,
    EventBus,
    RoundBegan,
    RoundCommitted,
    TrialErrored,
)
from popflow.flows.experiment.opening import Experiment, open_experiment, reopen
from popflow.flows.experiment.results import ResultGrid, results_of
from popflow.flows.record.artifacts import (
    best_text,
    finished_percent,
    leaderboard,
    progress_text,
    summary_markdown,
)
from popflow.flows.record.prefect_events import EventNotices
from popflow.flows.record.run_feed import CURRENT, Line, RunEnd, RunFeed
from popflow.flows.record.run_log import run_logger
from popflow.flows.spec.config import check_verbose, grows, placement_of
from popflow.flows.spec.run_spec import RunSpec
from popflow.infra.cluster.credentials_plugin import credentials_on_workers
from popflow.infra.cluster.dask_cluster import (
    ClusterStart,
    cluster_totals,
    dask_client,
    largest_worker,
)
from popflow.infra.cluster.scheduler_link import SchedulerLost
from popflow.infra.storage.errors import StorageError
from popflow.schedulers import PopulationBasedTraining, PopulationBasedTrainingReplay
from popflow.schedulers.resource_changing import ResourceChangingScheduler

logger = logging.getLogger(__name__)

#: Seconds the first round waits for its flow run to be Running on a server that answers
RECORD_WAIT_S = 15.0


class TrialError(RuntimeError):
    """``fail_fast="raise"``: a trial errored, and the experiment ended with it."""

    def __init__(self, trial_id: str, error: str) -> None:
        last = (error.strip().splitlines() or ["?"])[-1]
        super().__init__(f"trial {trial_id} errored (fail_fast='raise'): {last}\n{error}")
        self.trial_id = trial_id


class Trained(NamedTuple):
    """How the training ended: its results, the final state's message, the summary
    artifact's text (None: nothing was run)."""

    grid: ResultGrid
    message: str
    summary: str | None


def train(
    spec: RunSpec, cluster: str | Client | ClusterStart | None, resume: bool | str, feed: RunFeed
) -> RunEnd:
    """Run (or resume) the experiment ``spec`` describes on ``cluster``; its end, to be
    recorded. Raises what the training raised (the feed is told first)."""
    token = CURRENT.set(feed)
    try:
        trained = _train(spec, cluster, resume, feed)
    except BaseException as e:
        feed.end(RunEnd(error=e))
        raise
    finally:
        CURRENT.reset(token)
    end = RunEnd(trained.message, trained.grid, trained.summary)
    feed.end(end)
    return end


def _train(
    spec: RunSpec, cluster: str | Client | ClusterStart | None, resume: bool | str, feed: RunFeed
) -> Trained:
    with open_experiment(spec, resume) as experiment:
        _announce(experiment)
        title = experiment.name
        if experiment.resumed_from is not None:
            title += f" · resumed after round {experiment.resumed_from['round']}"
        feed.name(title)
        # an earlier driver held the lease (resumed, or killed before its first commit: a
        # fresh start then): its Prefect runs still Running are dead, and are said so
        lease = experiment.lease
        if lease is not None and (experiment.resumed_from is not None or lease.epoch > 1):
            feed.resumed(experiment.name, lease.epoch)
        if experiment.finished:
            grid = results_of(experiment.records, experiment.storage, spec.metric, spec.mode)
            return Trained(grid, f"{experiment.name} had already finished: nothing to run", None)
        committed = Committed(experiment)
        try:
            return _train_on(spec, cluster, experiment, feed, committed)
        except SchedulerLost as lost:
            raise committed.scheduler_lost(lost) from None


def _train_on(
    spec: RunSpec,
    cluster: str | Client | ClusterStart | None,
    experiment: Experiment,
    feed: RunFeed,
    committed: Committed,
) -> Trained:
    """The opened ``experiment``'s rounds on ``cluster``."""
    with (
        dask_client(cluster, spec.n_workers, spec.resources, grows(spec.scheduler)) as client,
        # before anything of the run reaches a worker: its storage pickles without them
        credentials_on_workers(client, experiment.storage.storage_options),
        # popflow.put's values, there before any trial can get them (a resume's rebound)
        objects_on_cluster(
            client,
            spec.param_space,
            experiment.records,
            experiment.storage,
            experiment.resumed_from is not None,
        ),
        shown(_live_table(spec, experiment), client) as table,
    ):
        # the flow run Running before the first round, where a server answers: it holds
        # every round (Prefect's import and its creation overlapped the cluster's start)
        if not feed.wait_for_record(RECORD_WAIT_S):
            logger.info("the Prefect record is not ready after %.0f s: training", RECORD_WAIT_S)
        # the console's table has the dashboard, the start and the end (the detail:
        # shown at verbose=3); the Prefect UI has them always
        run_logger().info("Dask dashboard: %s", client.dashboard_link, extra=DETAIL)
        slots, resizes = spec.resources, False
        if isinstance(spec.scheduler, ResourceChangingScheduler):  # what trials start with
            base = placement_of(spec.trainable, spec.resources)
            spec.scheduler.set_base_trial_resources(base)
            embedded = cluster is None or isinstance(cluster, ClusterStart)
            totals = cluster_totals(client, embedded)
            spec.scheduler.set_cluster_resources(totals, largest_worker(client, embedded))
            # slots sized by trial where the workers declare CPUs (the embedded ones do)
            if "CPU" in totals:
                slots, resizes = base.dask_resources(), True
        backend = DaskBackend(
            RunnerPool(client, slots, spec.name, _probe(cluster, experiment), resizes),
            spec.segment_timeout_s,
        )
        rounds = RoundRecord(feed, table)
        events = EventBus(_log_errors, rounds)
        if table is not None:
            events.subscribe(table.follow)
        topic = table.live.topic if table is not None else None
        controller = Controller(spec, experiment, backend, events, progress_topic=topic)
        fresh = experiment.resumed_from is None
        events.subscribe(committed)
        events.subscribe(EventNotices(feed, lambda: rounds.controller))  # Prefect events
        while True:
            rounds.controller = controller
            controller.hooks.use_storage(experiment.storage, fresh)  # trial.local_path
            controller.early_end.asked = feed.stop  # a cancel from Prefect ends the run
            try:
                controller.drive(fresh)
                break
            except StorageError as error:
                # storage unreachable past its retries: the lease may have lapsed
                lease_lost = experiment.lease.outage(error) if experiment.lease else None
                if lease_lost is None:
                    raise
                raise lease_lost from error
            except RoundLost as lost:
                # its results were decided on: only the last commit is certain
                experiment = reopen(spec, experiment, str(lost))
                run_logger().warning(
                    "%s; going on from round %d, the last committed",
                    lost,
                    experiment.resumed_from["round"] if experiment.resumed_from else 0,
                )
                rounds.lost()
                controller = Controller(
                    spec,
                    experiment,
                    backend,
                    events,
                    topic,
                    pipeline_after=lost.round_no + 1,
                    attempts=controller.attempts,  # the same epoch: its attempts go on
                )
                fresh = False
        grid = results_of(experiment.records, experiment.storage, spec.metric, spec.mode)
        if table is not None:
            table.close(experiment.records, grid, _how_it_ended(experiment, controller))
    failed = controller.early_end.failed
    if failed is not None and spec.fail_fast == "raise":
        raise TrialError(failed.trial_id, failed.error or "")
    records = experiment.records
    message = _how_it_ended(experiment, controller)
    if controller.early_end.spent:
        run_logger().info(message)
    else:
        controller.hooks.experiment_end()
        stuck = [r.trial_id for r in records if r.trial.is_live]
        if stuck:
            run_logger().warning(
                "%d trials never finished (the scheduler chose none to run): %s", len(stuck), stuck
            )
        run_logger().info(
            "%s finished: %d trials, %d errors; %s",
            experiment.name,
            len(grid),
            grid.num_errors,
            spec.scheduler.debug_string(),
            extra=DETAIL,
        )
    population = isinstance(spec.scheduler, PopulationBasedTraining | PopulationBasedTrainingReplay)
    summary = summary_markdown(grid, message, records, spec.metric, spec.mode, population)
    return Trained(grid, message, summary)


class Committed:
    """The last round committed, from the run's events: what a stopped run resumes after."""

    def __init__(self, experiment: Experiment) -> None:
        self.storage = experiment.storage
        self.round = (experiment.resumed_from or {}).get("round", 0)
        self.running: int | None = None  # the round begun last

    def __call__(self, event: Event) -> None:
        if isinstance(event, RoundCommitted):
            self.round = event.round
        elif isinstance(event, RoundBegan):
            self.running = event.round

    def scheduler_lost(self, lost: SchedulerLost) -> SchedulerLost:
        """The one line a user reads: what went, what was kept, how to go on."""
        when = (
            "before the run's first round" if self.running is None else f"in round {self.running}"
        )
        return SchedulerLost(
            f"{lost} {when} (rounds up to {self.round} are committed); its workers closed "
            "with it: start the scheduler and its workers again, then `popflow resume "
            f"{self.storage.url}` (with --dask-address if the scheduler's address changed; "
            f"what finished after round {self.round} runs again)"
        )


def _probe(
    cluster: str | Client | ClusterStart | None, experiment: Experiment
) -> StorageProbe | None:
    """The storage probe for a cluster of the user's (``dask_address``), whose workers may
    be on other machines; the embedded cluster's run on this one."""
    if cluster is None or isinstance(cluster, ClusterStart):
        return None
    lease = experiment.lease
    return StorageProbe(experiment.storage, lease.guard() if lease is not None else lambda: None)


def _log_errors(event: Event) -> None:
    """A trial's error, in the run's log (the console and the Prefect UI)."""
    if isinstance(event, TrialErrored):
        run_logger().error("trial %s errored: %s", event.record.trial_id, event.reason)


class RoundRecord:
    """Each round as the Prefect UI shows it (a ``round-N`` task run: its summary and
    decisions in its logs; the leaderboard and progress on the Artifacts page), from
    the driver's events. A round is done there once committed; on an object store the
    next one began training before that (:mod:`popflow.flows.driver.pipelined_commit`):
    it begins in the record after, with the time it began."""

    def __init__(self, feed: RunFeed, table: LiveTable | None) -> None:
        self.feed, self.table = feed, table
        self.controller: Controller | None = None
        self._open: int | None = None  # the round begun in the record, not yet done
        self._next: RoundBegan | None = None  # the one that began before it was done

    def __call__(self, event: Event) -> None:
        if isinstance(event, RoundBegan):
            if self._open is None:
                self._begin(event)
            elif event.round > self._open:
                self._next = event
            # else: the open round runs again (RoundLost): still the same task run
        elif isinstance(event, RoundCommitted) and event.round == self._open:
            self._done(event)
            self._open = None
            if self._next is not None:
                self._begin(self._next)
                self._next = None

    def lost(self) -> None:
        """The run goes back to its last commit: the round that began after it never was."""
        self._next = None

    def _begin(self, event: RoundBegan) -> None:
        self.feed.round_begins(event.round, at=event.at)
        self._open = event.round

    def _done(self, event: RoundCommitted) -> None:
        assert self.controller is not None
        records, spec = self.controller.records, self.controller.spec
        best = best_text(records, spec.metric, spec.mode)
        # the console shows the detail at verbose=3 only; the Prefect UI always
        lines = [Line(logging.INFO, round_summary(event, best), detail=True)]
        lines += [Line(logging.INFO, d, detail=True) for d in event.decisions]
        lines += [
            Line(logging.INFO, e)
            for e in event.events
            if not e.startswith(("[exploit]", "[error]"))  # said above, or when it errored
        ]
        rows = leaderboard(records, spec.metric, spec.mode)
        done = finished_percent(len(records), self.controller.index.live)
        progress = progress_text(records, spec.metric, spec.mode)
        self.feed.round_done(event.round, lines, rows, done, progress)
        if self.table is not None:
            self.table.tick(records, event.round)


def round_summary(event: RoundCommitted, best: str = "") -> str:
    """One line on a committed round, for the Prefect UI (its task run's first log line);
    ``best``: the best result so far (:func:`~popflow.flows.record.artifacts.best_text`)."""
    counts = event.counts
    states = ", ".join(f"{counts[status]} {status.lower()}" for status in sorted(counts))
    said = f"{best}; " if best else ""
    return (
        f"round {event.round} committed: {event.results} results; {said}"
        f"trials {states}; {event.scheduler}"
    )


def _announce(experiment: Experiment) -> None:
    """Where the experiment lives and its seed, first thing in the flow run's logs."""
    if experiment.finished:
        state = "already finished; returning its results"
    elif experiment.resumed_from is not None:
        state = f"resuming after round {experiment.resumed_from['round']}"
    else:
        state = f"{len(experiment.records)} trials"
    run_logger().info(
        "%s: %s; results in %s (seed %d)",
        experiment.name,
        state,
        experiment.storage.url,
        experiment.seed,
        # a fresh start: the console's table header says it (verbose=3 shows it too); a
        # resume or a finished experiment is news there
        extra=DETAIL if experiment.resumed_from is None and not experiment.finished else None,
    )


def _how_it_ended(experiment: Experiment, controller: Controller) -> str:
    """The run's last word: finished, or its budget spent (what to do next)."""
    records = experiment.records
    if controller.early_end.spent:
        to_go = sum(1 for r in records if r.trial.is_live)
        return (
            f"{experiment.name}: {controller.early_end.ended_by} after round "
            f"{controller.rounds}; {to_go} trials to go, committed: resume "
            f"(resume='auto', Tuner.restore, `popflow resume {experiment.storage.url}`) "
            "goes on from here"
        )
    errors = sum(1 for r in records if r.error)
    return f"{experiment.name} finished: {len(records)} trials, {errors} errors"


def _live_table(spec: RunSpec, experiment: Experiment) -> LiveTable | None:
    """The console's trial table at ``spec.verbose`` (none at 0)."""
    verbose = check_verbose(spec.verbose)
    if verbose == 0:
        return None
    return LiveTable(
        verbose,
        name=experiment.name,
        path=experiment.storage.url,
        seed=experiment.seed,
        scheduler=type(spec.scheduler).__name__,
        metric=spec.metric,
        mode=spec.mode,
    )
