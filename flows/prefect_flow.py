"""The Prefect side of a run: the ``tune`` flow, its ``round`` task, and flow retries.

Each round is a Prefect task (visible in the UI, with the round's summary and
decisions in its logs); the segments inside it are runner-actor calls on
Dask workers, which never talk to Prefect. The flow and its task are made on
the first run (:func:`prefect_objects`): every Dask worker imports popflow,
and Prefect's import would cost each ~1 s of CPU and ~45 MB for nothing.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from distributed import Client

from popflow.flows.artifacts import RunArtifacts
from popflow.flows.console import DETAIL, check_verbose
from popflow.flows.controller import Controller
from popflow.flows.experiment import Experiment, open_experiment
from popflow.flows.flow_parameters import Shown
from popflow.flows.live_table import LiveTable, shown
from popflow.flows.results import ResultGrid, results_of
from popflow.flows.run_log import run_logger
from popflow.flows.run_spec import RunSpec
from popflow.flows.runner_pool import RunnerPool
from popflow.flows.stale_runs import close_stale_runs
from popflow.infra.cluster import ClusterStart, dask_client

logger = logging.getLogger("popflow")


def is_flow_retry() -> bool:
    """True inside a Prefect flow run that is being retried (run_count > 1).

    Checked both where ``run`` is called (a retried parent flow: its ``tune``
    subflow is a new run) and inside the ``tune`` flow (a retry of it).
    """
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    return bool(ctx and ctx.flow_run and ctx.flow_run.run_count > 1)


#: A flow run that has started this many times (Prefect's flow retries, and re-runs of
#: its crashes by ``automations.yaml``) is not started again: it ends Failed, which the
#: re-run automation does not answer, instead of crashing in a loop.
MAX_RUN_COUNT = 5


class TooManyRuns(RuntimeError):
    """The flow run has started more than :data:`MAX_RUN_COUNT` times."""


def refuse_crash_loop() -> None:
    """Raise :class:`TooManyRuns` in a flow run on its ``MAX_RUN_COUNT + 1``-th start."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    count = ctx.flow_run.run_count if ctx and ctx.flow_run else 0
    if count > MAX_RUN_COUNT:
        raise TooManyRuns(
            f"flow run {ctx.flow_run.name!r} has started {count} times (retries and re-runs "
            f"of its crashes); popflow does not start it again after {MAX_RUN_COUNT}. The "
            "experiment is committed in storage: read the earlier runs' logs, fix the "
            "cause, then run the deployment again (it resumes)"
        )


def _round(controller: Controller, artifacts: RunArtifacts) -> bool:
    """One round as a Prefect task: its summary and decisions show in the task's logs, the
    leaderboard and progress on the Artifacts page."""
    more = controller.run_round()
    log = run_logger()
    # the console shows the detail at verbose=3 only; the Prefect UI always
    log.info(round_summary(controller), extra=DETAIL)
    for decision in controller.last_commit["decisions"]:
        log.info(decision, extra=DETAIL)  # each exploit once, in Ray's words
    for event in controller.last_commit["events"]:
        if not event.startswith(("[exploit]", "[error]")):  # said above, or when it errored
            log.info(event)
    artifacts.round(controller.records, controller.rounds)
    if controller.display is not None:
        controller.display.tick(controller.records, controller.rounds)
    return more


def round_summary(controller: Controller) -> str:
    """One line on the last committed round, for the Prefect UI."""
    counts: dict[str, int] = {}
    for rec in controller.records:
        counts[rec.trial.status.value] = counts.get(rec.trial.status.value, 0) + 1
    states = ", ".join(f"{n} {status.lower()}" for status, n in sorted(counts.items()))
    return (
        f"round {controller.rounds} committed: {controller.last_commit['results']} results; "
        f"trials {states}; {controller.scheduler.debug_string()}"
    )


def _announce(spec: RunSpec, experiment: Experiment) -> None:
    """Where the experiment lives and its seed, first thing in the flow run's logs."""
    log = run_logger()
    if experiment.finished:
        state = "already finished; returning its results"
    elif experiment.resumed_from is not None:
        state = f"resuming after round {experiment.resumed_from['round']}"
    else:
        state = f"{len(experiment.records)} trials"
    log.info(
        "%s: %s; results in %s (seed %d)",
        experiment.name,
        state,
        experiment.storage.url,
        experiment.seed,
    )


#: Prefect's setting for its server's telemetry service.
ANALYTICS = "PREFECT_SERVER_ANALYTICS_ENABLED"
#: Prefect's setting for how long it waits for its embedded server to answer.
STARTUP_TIMEOUT = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
#: popflow's wait (Prefect's is 20 s, which a loaded 2-core machine overran: the
#: server's first start migrates its database while the Dask workers start).
EMBEDDED_STARTUP_TIMEOUT_S = 90


def _users_own(setting: str) -> bool:
    """Whether the user set ``setting``, in the environment or in their Prefect profile."""
    from prefect.context import get_settings_context

    if setting in os.environ:
        return True
    return any(getattr(k, "name", "") == setting for k in get_settings_context().profile.settings)


def quiet_embedded_server() -> None:
    """Start Prefect's embedded server (no ``PREFECT_API_URL``) without its telemetry
    service, which prints ``Failed to send telemetry`` offline and a ``database is
    locked`` traceback under load. A user's own setting (environment or profile) is kept."""
    from prefect.settings import get_current_settings

    if get_current_settings().api.url or _users_own(ANALYTICS):
        return
    os.environ[ANALYTICS] = "false"


@contextmanager
def embedded_server_settings() -> Iterator[None]:
    """Within: the embedded server (no ``PREFECT_API_URL``) quiet, and waited for
    ``EMBEDDED_STARTUP_TIMEOUT_S`` when it starts; a user's own settings are kept."""
    from prefect.settings import (
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        get_current_settings,
        temporary_settings,
    )

    quiet_embedded_server()
    if get_current_settings().api.url or _users_own(STARTUP_TIMEOUT):
        yield
        return
    wait = {PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: EMBEDDED_STARTUP_TIMEOUT_S}
    with temporary_settings(updates=wait):
        yield


class TrialError(RuntimeError):
    """``fail_fast="raise"``: a trial errored, and the experiment ended with it."""

    def __init__(self, trial_id: str, error: str) -> None:
        last = (error.strip().splitlines() or ["?"])[-1]
        super().__init__(f"trial {trial_id} errored (fail_fast='raise'): {last}\n{error}")
        self.trial_id = trial_id


def tune_flow(
    name: str,
    spec: Shown[RunSpec] | RunSpec,
    cluster: Shown[str | Client | ClusterStart | None] | str | Client | ClusterStart | None,
) -> Any:
    """Run (or resume) the experiment ``spec`` describes, on ``cluster``.

    ``name``: the experiment's (``spec.name``), a flow-run parameter that the
    UI shows. ``spec`` and ``cluster`` come :class:`Shown` as the UI shows them
    (:mod:`popflow.flows.flow_parameters`: never the storage's credentials).
    ``cluster``: a Dask scheduler's address, a Client, the embedded cluster
    being started, or None (start one here).
    """
    if isinstance(spec, Shown):
        spec = spec.value
    if isinstance(cluster, Shown):
        cluster = cluster.value
    resume = spec.resume or ("auto" if is_flow_retry() else False)
    with open_experiment(spec, resume) as experiment:
        _announce(spec, experiment)
        if experiment.resumed_from is not None and experiment.lease is not None:
            close_stale_runs(experiment.name, experiment.lease.epoch)
        if experiment.finished:
            grid = results_of(experiment.records, experiment.storage, spec.metric, spec.mode)
            return _ended(grid, f"{experiment.name} had already finished: nothing to run")
        with (
            dask_client(cluster, spec.n_workers, spec.resources) as client,
            shown(_live_table(spec, experiment), client) as table,
        ):
            run_logger().info("Dask dashboard: %s", client.dashboard_link)
            pool = RunnerPool(client, spec.resources, spec.name)
            controller = Controller(spec, experiment, pool)
            controller.display = table
            artifacts = RunArtifacts(experiment.name, spec.metric, spec.mode)
            if experiment.resumed_from is None:
                controller.commit()  # round 0: the sampled population, before any training
            try:
                round_no = controller.rounds + 1
                round_task = prefect_objects().round_task
                while round_task.with_options(task_run_name=f"round-{round_no}")(
                    controller, artifacts
                ):
                    round_no += 1
                controller.seal()
            finally:
                controller.cancel()
                pool.close()
                artifacts.flush()  # a run that ends by an error sends no summary
            grid = results_of(experiment.records, experiment.storage, spec.metric, spec.mode)
            if table is not None:
                table.close(experiment.records, grid, _how_it_ended(experiment, controller))
        failed = controller.early_end.failed
    if failed is not None and spec.fail_fast == "raise":
        raise TrialError(failed.trial_id, failed.error or "")
    records = experiment.records
    stuck = [r.trial_id for r in records if r.trial.is_live]
    if controller.early_end.spent:
        message = _how_it_ended(experiment, controller)
        run_logger().info(message)
        artifacts.final(grid, message, records)
        return _ended(grid, message)
    controller.hooks.experiment_end()
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
    )
    message = _how_it_ended(experiment, controller)
    artifacts.final(grid, message, records)
    return _ended(grid, message)


def _how_it_ended(experiment: Experiment, controller: Controller) -> str:
    """The run's last word: finished, or its budget spent (what to do next)."""
    records = experiment.records
    if controller.early_end.spent:
        to_go = sum(1 for r in records if r.trial.is_live)
        return (
            f"{experiment.name}: {controller.early_end.budget} spent after round "
            f"{controller.rounds}; {to_go} trials to go, committed: resume "
            "(resume='auto', Tuner.restore) goes on from here"
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


def _ended(grid: ResultGrid, message: str) -> Any:
    """The flow run's final state: Completed, with ``message`` (what the UI shows for the
    run: finished, budget spent, or nothing to do); the caller gets ``grid``."""
    from prefect.states import Completed

    grid.summary = message  # for a parent flow's own final state
    return Completed(message=message, data=grid)


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
        round_task=task(name="round", cache_policy=NO_CACHE)(_round),
    )
