"""The Prefect side of a run: the ``tune`` flow run that records it, and flow retries.

``popflow.run`` trains in the calling thread (:mod:`popflow.flows.api.training`) and
records the run in Prefect from a thread of its own (:class:`PrefectRecord`),
which imports Prefect while the cluster starts, finds its server (:func:`prefect_api`)
and runs the ``tune`` flow: its body turns the training's feed
(:mod:`popflow.flows.record.run_feed`) into the flow run's logs, a ``round-N`` task run
per round (its summary and decisions in its logs), the artifacts and the final state.
Where a server answers, the flow run is Running before the first round, so it holds
every round: made before Prefect's import where its server is known without it
(:mod:`popflow.flows.record.early_run`), else waited for by the first round; a server
that must start first is not waited for (the record says it started late). The run's end waits until all is recorded.

Dask workers never talk to Prefect. The flow and its task are made on first use
(:func:`prefect_objects`): every Dask worker imports popflow, and Prefect's
import would cost each CPU time and memory for nothing.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import threading
import time
import traceback
from typing import Any, NamedTuple

from popflow.flows.console.live_lines import claim, live
from popflow.flows.console.verbose import console_verbosity
from popflow.flows.record.artifacts import RunArtifacts
from popflow.flows.record.early_run import EarlyRun, adopt, early_api_url, first_lines
from popflow.flows.record.flow_parameters import Shown
from popflow.flows.record.heartbeat import engine_heartbeats_off, heartbeats
from popflow.flows.record.plot_artifacts import PlotRefresh
from popflow.flows.record.prefect_control import (
    cancel_watch,
    cancelled_state,
    worker_cancel_state,
)
from popflow.flows.record.prefect_events import emit_notice
from popflow.flows.record.prefect_server import answers, prefect_api, server_answers
from popflow.flows.record.round_runs import RoundRuns, late_start_line, log_at
from popflow.flows.record.run_feed import (
    Line,
    Notice,
    Resumed,
    RoundBegins,
    RoundDone,
    RunEnd,
    RunFeed,
)
from popflow.flows.record.run_log import popflow_logger, run_logger
from popflow.flows.record.stale_runs import close_stale_runs
from popflow.flows.spec.run_spec import RunSpec
from popflow.infra.store.lease import LEASE_ERRORS

logger = logging.getLogger(__name__)


class RunFailed(RuntimeError):
    """The ``tune`` flow run's error when the training raised: the training's own
    exception is raised to the caller of ``popflow.run``, this one ends the flow run."""


#: The ``tune`` flow's parameters, in order
_PARAMETERS = ("name", "spec", "cluster")

#: The feed the ``tune`` flow of this thread records (set by :class:`PrefectRecord`).
_RECORDING: contextvars.ContextVar[RunFeed | None] = contextvars.ContextVar(
    "popflow_recording", default=None
)
#: Seconds between the ``tune`` flow run's heartbeats (None: none), as the user's settings ask.
_HEARTBEAT_S: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "popflow_heartbeat_s", default=None
)


def tune_flow(name: str, spec: Shown[RunSpec] | RunSpec, cluster: Shown[Any] | Any) -> Any:
    """Record the training of the experiment ``spec`` describes, on ``cluster``.

    The flow run's parameters are what the UI shows of the run (``name``, the
    spec and the cluster, :mod:`popflow.flows.record.flow_parameters`: never the
    storage's credentials). Its body replays the training's feed as it comes:
    lines to the flow run's log, each round as a ``round-N`` task run at the
    round's real times (:mod:`popflow.flows.record.round_runs`), the artifacts, and the
    end as the final state (Completed with how it ended, or Failed with the
    training's error). Its heartbeats are popflow's
    (:mod:`popflow.flows.record.heartbeat`): the run's end does not wait for them.
    """
    feed = _RECORDING.get()
    if feed is None:
        raise RuntimeError("the tune flow records a run of popflow.run: call popflow.run")
    if isinstance(spec, Shown):
        spec = spec.value
    experiment = spec.storage.child(spec.name)
    plots = PlotRefresh(name, experiment.url, experiment.storage_options)
    artifacts = RunArtifacts(name, spec.metric, spec.mode, plots)
    feed.record_ready.set()  # the flow run is Running: the first round may begin
    if feed.first_round_at is not None and feed.early_run is None:  # made after round 1
        _log(late_start_line(feed.first_round_at))
    with heartbeats(_HEARTBEAT_S.get()), cancel_watch(feed.stop):
        return _replay(feed, artifacts, RoundRuns(prefect_objects().round_task))


def _replay(feed: RunFeed, artifacts: RunArtifacts, rounds: RoundRuns) -> Any:
    """The ``tune`` flow's body: the feed's events as they come, until the run's end."""
    try:
        while (event := feed.next()) is not None:
            if isinstance(event, Line):
                _log(event)
            elif isinstance(event, RoundBegins):
                end = _round(feed, artifacts, rounds, event)
                if end is not None:
                    return _ended(end, artifacts)
            elif isinstance(event, Resumed):
                close_stale_runs(event.experiment, event.epoch, prefect_objects())
            elif isinstance(event, Notice):  # Prefect events for automations
                emit_notice(event)
            elif isinstance(event, RunEnd):
                return _ended(event, artifacts)
    finally:
        artifacts.flush()  # a run that ends by an error sends no summary
    raise RuntimeError("the training's feed ended without its end")  # pragma: no cover


def _round(
    feed: RunFeed, artifacts: RunArtifacts, rounds: RoundRuns, begins: RoundBegins
) -> RunEnd | None:
    """One round as its task run, Running from the round's start to its commit: the lines
    logged meanwhile, then its summary and decisions, in its logs; the leaderboard and
    progress on the Artifacts page. The run's end inside a round (the training raised)
    ends the round's task run Failed (Crashed for an interrupt) and is returned."""
    run = rounds.begin(begins.round_no, begins.at)
    while (event := feed.next()) is not None:
        if isinstance(event, Line):
            _log(event, run.logger)
        elif isinstance(event, Notice):  # Prefect events for automations
            emit_notice(event)
        elif isinstance(event, RoundDone):
            for line in event.lines:
                _log(line, run.logger)
            rounds.end(run, event.at)
            artifacts.round_rows(event.rows, event.done_percent, event.round_no, event.progress)
            return None
        elif isinstance(event, RunEnd):
            rounds.end(run, event.at, event.error)
            return event
    return None


def _log(line: Line, to: Any = None) -> None:
    """``line`` to the flow run's log (or ``to``, a round's), at the time it was said."""
    log_at(to if to is not None else run_logger(), line)


def _ended(end: RunEnd, artifacts: RunArtifacts) -> Any:
    """The flow run's final state: Completed, with how the run ended (what the UI shows:
    finished, budget spent, or nothing to do), or the training's error."""
    from prefect.states import Completed

    if end.error is not None:
        if (cancelled := worker_cancel_state(end.error, artifacts.experiment)) is not None:
            return cancelled  # a process worker's cancel: SIGTERM after its intent
        if not isinstance(end.error, Exception):
            raise KeyboardInterrupt()  # Prefect marks the run Crashed, as for any interrupt
        if isinstance(end.error, LEASE_ERRORS):  # no bug to trace: its line says what to do
            from prefect.states import Failed

            run_logger().error("%s: %s", type(end.error).__name__, end.error)
            return Failed(message=f"{type(end.error).__name__}: {end.error}")
        trace = "".join(traceback.format_exception(end.error)).rstrip()
        run_logger().error("the training raised:\n%s", trace)
        raise RunFailed(f"{type(end.error).__name__}: {end.error}") from None
    if end.summary is not None:
        artifacts.final_text(end.summary, end.message)
    end.grid.summary = end.message  # for a parent flow's own final state
    feed = _RECORDING.get()  # a cancel from Prefect that ended the run: Cancelled
    cancelled = cancelled_state(feed.stop, end.message, end.grid) if feed else None
    return cancelled or Completed(message=end.message, data=end.grid)


#: Seconds the record waits for the run's events (task run states, heartbeats) to be sent.
EVENTS_WAIT_S = 10.0
#: Seconds between two looks at a record not yet finished, once the training has ended
FINISH_LOOK_S = 1.0
#: Seconds the end of a run waits for a Prefect server that does not answer
UNANSWERED_S = 15.0


def _send_events() -> None:
    """Send the run's queued Prefect events before ``run()`` returns. Prefect's own
    heartbeat thread used to hold the flow's end for the rest of its step, time in which
    they went out; without it a script's exit found them queued ("EventsWorker - Still
    processing items")."""
    from prefect.events.worker import EventsWorker

    # Prefect's progress note while a drain waits ("Still processing items: 6 items
    # remaining..."), printed under load; an unsent event is said below instead
    progress = logging.getLogger(EventsWorker.__name__)
    progress.addFilter(_not_still_processing)
    try:
        _, unsent = EventsWorker.drain_all(timeout=EVENTS_WAIT_S, at_exit=False)
    finally:
        progress.removeFilter(_not_still_processing)
    if unsent:
        logger.warning(
            "the Prefect record's last events were not sent within %.0f s", EVENTS_WAIT_S
        )


def _not_still_processing(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Still processing items")


class PrefectRecord:
    """The ``tune`` flow run of one training, recorded from a thread of its own.

    :meth:`start` before the training: the thread imports Prefect, finds (or
    starts) its server and replays :attr:`feed` as the training fills it.
    :meth:`finish` after: waits until everything is recorded. The thread runs
    in a copy of the caller's context, so inside a flow run (a deployment's) the
    ``tune`` run is its subflow. Prefect is told, never relied on: if it cannot
    be reached, the training goes on and its lines reach the console.
    """

    def __init__(self, spec: RunSpec, shown: tuple[Shown[RunSpec], Shown[Any]]) -> None:
        self.spec = spec
        self.feed = RunFeed()
        self.error: BaseException | None = None
        #: the API the record reports to, once known (None: a server still starting, or
        #: Prefect's temporary one)
        self.api_url: str | None = None
        self._shown = shown
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._record,), name="popflow-prefect-record", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def finish(self) -> None:
        """Wait until the run is recorded; a record that failed is warned about. A server
        that stops answering is not waited for (Prefect's client retries a request for
        minutes): after :data:`UNANSWERED_S` without an answer to its health check the run
        returns, its record incomplete. A server still starting is waited for (its start
        has its own limit)."""
        silent_since: float | None = None
        while self._thread.is_alive():
            self._thread.join(FINISH_LOOK_S)
            url = self.api_url
            if not self._thread.is_alive() or url is None or answers(url):
                silent_since = None
                continue
            silent_since = silent_since or time.monotonic()
            if time.monotonic() - silent_since >= UNANSWERED_S:
                logger.warning(
                    "the Prefect record of %s is incomplete (its results are in storage): "
                    "the Prefect server at %s stopped answering",
                    self.spec.name,
                    url,
                )
                return
        # the training's own error, an interrupt, or a cancel (Prefect raises on the
        # Cancelled state the flow returned): said already, not the record's trouble
        quiet = isinstance(self.error, RunFailed | KeyboardInterrupt) or self.feed.stop.honoured
        if self.error is not None and not quiet:
            said = str(self.error) if str(self.error) not in ("", "None") else ""
            logger.warning(
                "the Prefect record of %s is incomplete (its results are in storage): %s",
                self.spec.name,
                said or type(self.error).__name__,  # Prefect's ObjectNotFound says "None"
            )

    def _record(self) -> None:
        _RECORDING.set(self.feed)
        early = self._early_run()
        try:
            # Prefect's import (it sets up its logging) while the cluster starts
            tune = prefect_objects().tune_flow
            from prefect import tags

            if early is None and not server_answers():  # one must start first: the
                self.feed.record_ready.set()  # rounds do not wait for it
            with (
                console_verbosity(self.spec.verbose),
                live(self.feed),  # the run's lines print when said from here on
                prefect_api(),
                engine_heartbeats_off() as every,
                tags(*run_tags(self.spec)),
            ):
                from prefect.settings import get_current_settings

                self.api_url = get_current_settings().api.url  # the server finish() watches
                if early is not None and not early.serves(self.api_url):
                    early.withdraw()  # made on a server this record does not report to
                    early = self.feed.early_run = None
                self.feed.titled.wait()
                _HEARTBEAT_S.set(every)
                try:
                    if early is not None:
                        adopt(tune, early, dict(zip(_PARAMETERS, self._parameters(), strict=True)))
                    else:
                        tune = tune.with_options(flow_run_name=self.feed.title or self.spec.name)
                        tune(*self._parameters())
                finally:
                    _send_events()
        except BaseException as e:  # the training's, or Prefect's trouble
            if early is not None:
                early.crash(f"the Prefect record failed: {e!r}")
            self.error = e
            self.feed.record_ready.set()  # the training never waits for a record that failed
            self._drain()
        finally:
            self.feed.record_ready.set()

    def _parameters(self) -> tuple[Any, ...]:
        """The ``tune`` flow's arguments (:data:`_PARAMETERS`)."""
        return (self.spec.name, *self._shown)

    def _early_run(self) -> EarlyRun | None:
        """The flow run made Running before Prefect's import, where its server is known
        without it (:mod:`popflow.flows.record.early_run`): the first round need not wait
        for the import. Made once the experiment is named (its flow run's name)."""
        try:
            url = early_api_url()
        except Exception as e:  # a bad setting: said by the path that reads it with Prefect
            logger.debug("no flow run before Prefect's import: %s", e)
            return None
        if url is None:
            return None
        self.feed.titled.wait()
        shown = {
            k: dict(v) if isinstance(v, Shown) else v
            for k, v in zip(_PARAMETERS, self._parameters(), strict=True)
        }
        early = EarlyRun.create(url, self.feed.title or self.spec.name, shown, run_tags(self.spec))
        if early is not None:
            early.on_cancel = self.feed.stop.ask
            self.feed.early_run = early
            for line in first_lines(early):  # in the console's order, not the engine's
                self.feed.line(logging.INFO, line)
            self.feed.record_ready.set()  # Running: the first round may begin
        return early

    def _drain(self) -> None:
        """The feed's lines not yet recorded, to popflow's logger (the console)."""
        while (event := self.feed.next()) is not None:
            lines = event.lines if isinstance(event, RoundDone) else [event]
            for line in lines:
                if isinstance(line, Line) and not claim(line) and not line.detail:
                    popflow_logger.log(line.level, line.message)


class PrefectObjects(NamedTuple):
    tune_flow: Any  # prefect.Flow
    round_task: Any  # prefect.Task


@functools.cache
def prefect_objects() -> PrefectObjects:
    """The ``tune`` flow and its ``round`` task, made on first use."""
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE

    return PrefectObjects(
        tune_flow=flow(name="tune", validate_parameters=False)(tune_flow),
        round_task=task(name="round", cache_policy=NO_CACHE)(_a_round),
    )


def _a_round() -> None:
    """Never run: the ``round`` task's name and key, of the task runs :class:`RoundRuns`
    writes at the rounds' real times."""


def run_tags(spec: RunSpec) -> list[str]:
    """The ``tune`` flow run's tags: what the UI's runs list filters by."""
    return ["popflow", f"experiment:{spec.name}", f"scheduler:{type(spec.scheduler).__name__}"]
