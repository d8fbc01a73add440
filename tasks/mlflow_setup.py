"""Ray's ``setup_mlflow``: an MLflow run for the trial, opened inside the trainable.

    from popflow.air.integrations.mlflow import setup_mlflow
    def train_fn(config):
        mlflow = setup_mlflow(config, experiment_name="exp", tracking_uri="sqlite:///m.db")
        for step in range(10):
            mlflow.log_metrics({"loss": 1 / (step + 1)}, step=step)
            tune.report({"loss": 1 / (step + 1)})

Where :class:`MLflowLoggerCallback` logs results from the driver, this runs on the
trial's worker, so the training code can log figures, models and its own metrics.
Needs the ``mlflow`` extra. As Ray's: the experiment is ``experiment_id`` or
``experiment_name`` (``MLFLOW_EXPERIMENT_ID``/``MLFLOW_EXPERIMENT_NAME`` in the
environment, then the trial's id and name), made only with
``create_experiment_if_not_exists``; the run is named ``run_name`` or the experiment's
name; the config, flattened with ``/``, is logged as its params (an ``mlflow`` key
left out). Beyond Ray 2.60: settings in ``config["mlflow"]`` (Ray's older form, which
its own ``mlflow_example`` still uses) are taken where no argument gives them.
"""

from __future__ import annotations

import os
from typing import Any

from popflow.infra.optional_imports import require
from popflow.schedulers.search_space import flat_keys
from popflow.tasks.trial_context import at_discard, get_context

#: the runs this function opened, with their tracking URIs (a worker thread may still
#: hold one of an earlier trial as its active run)
_opened: dict[str, str] = {}
#: the tag naming the run's trial (MLflowLoggerCallback's too)
TRIAL_TAG = "trial_name"
#: the keys of ``config["mlflow"]`` this function takes, as in Ray before 2.8
_CONFIG_KEYS = (
    "tracking_uri",
    "registry_uri",
    "experiment_id",
    "experiment_name",
    "tracking_token",
    "artifact_location",
    "run_name",
    "create_experiment_if_not_exists",
    "tags",
)


def setup_mlflow(
    config: dict[str, Any] | None = None,
    tracking_uri: str | None = None,
    registry_uri: str | None = None,
    experiment_id: str | None = None,
    experiment_name: str | None = None,
    tracking_token: str | None = None,
    artifact_location: str | None = None,
    run_name: str | None = None,
    create_experiment_if_not_exists: bool = False,
    tags: dict[str, Any] | None = None,
    rank_zero_only: bool = True,
) -> Any:
    """Open (or join) the trial's MLflow run; the ``mlflow`` module, to log with.
    ``rank_zero_only`` is Ray Train's and has no effect in a trial, as in Ray Tune."""
    mlflow = require("mlflow", "mlflow", "setup_mlflow")
    config = dict(config or {})
    given = config.pop("mlflow", None) or {}
    if not isinstance(given, dict):
        raise TypeError(f"config['mlflow'] is {given!r}, but must be a dict of settings")
    unknown = sorted(set(given) - set(_CONFIG_KEYS))
    if unknown:
        raise ValueError(f"config['mlflow'] has unknown settings {unknown}: {list(_CONFIG_KEYS)}")
    tracking_uri = tracking_uri or given.get("tracking_uri")
    registry_uri = registry_uri or given.get("registry_uri")
    tracking_token = tracking_token or given.get("tracking_token")
    artifact_location = artifact_location or given.get("artifact_location")
    run_name = run_name or given.get("run_name")
    tags = tags if tags is not None else given.get("tags")
    create = create_experiment_if_not_exists or bool(given.get("create_experiment_if_not_exists"))
    try:
        context = get_context()
        trial_id, trial_name = context.get_trial_id(), context.get_trial_name()
    except RuntimeError:  # outside a trial: the arguments and the environment only
        trial_id = trial_name = None
    experiment_id = experiment_id or given.get("experiment_id") or None
    experiment_name = experiment_name or given.get("experiment_name") or None

    if tracking_token:
        os.environ["MLFLOW_TRACKING_TOKEN"] = tracking_token
    if tracking_uri is not None:
        mlflow.set_tracking_uri(tracking_uri)
    if registry_uri is not None:
        mlflow.set_registry_uri(registry_uri)
    found = _experiment(
        mlflow,
        experiment_id or os.environ.get("MLFLOW_EXPERIMENT_ID") or trial_id,
        experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME") or trial_name,
        create,
        artifact_location,
    )
    name = experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME") or trial_name
    active = mlflow.active_run()
    ours = active is not None and active.info.run_id in _opened
    if ours and active.data.tags.get(TRIAL_TAG) != trial_name:
        # another trial's run, left active in this worker thread (a Ray actor serves one
        # trial; a popflow worker thread serves many)
        _close(mlflow, active.info.run_id)
        active = None
    if active is None:
        run_tags = {**(tags or {}), **({TRIAL_TAG: trial_name} if trial_name else {})}
        active = mlflow.start_run(run_name=run_name or name, experiment_id=found, tags=run_tags)
        _opened[active.info.run_id] = mlflow.get_tracking_uri()
        if trial_name is not None:
            _end_with_the_trial(mlflow, active.info.run_id)
    params = flat_keys(config)
    if params:
        mlflow.log_params(params)
    return mlflow


def _close(mlflow: Any, run_id: str, status: str | None = None) -> None:
    """Take a run this function opened off this thread's active runs, in the tracking
    store it lives in, with ``status`` (None: the one its trial's end gave it)."""
    current = mlflow.get_tracking_uri()
    try:
        mlflow.set_tracking_uri(_opened.pop(run_id))
        if status is None:
            status = mlflow.get_run(run_id).info.status
        mlflow.end_run(status=status if status != "RUNNING" else "FINISHED")
    finally:
        mlflow.set_tracking_uri(current)


def _end_with_the_trial(mlflow: Any, run_id: str) -> None:
    """The run ends (FINISHED, or FAILED) when the trial's trainable object goes, as a
    Ray actor's process exit ends it; off this thread's active runs too where the object
    goes in the thread that opened it (else the next setup_mlflow there takes it off)."""
    client = mlflow.tracking.MlflowClient(tracking_uri=mlflow.get_tracking_uri())

    def end(failed: bool) -> None:
        status = "FAILED" if failed else "FINISHED"
        active = mlflow.active_run()
        if active is not None and active.info.run_id == run_id and run_id in _opened:
            _close(mlflow, run_id, status)
        else:
            client.set_terminated(run_id, status)

    at_discard(end)


def _experiment(
    mlflow: Any, experiment_id: str | None, name: str | None, create: bool, location: str | None
) -> str:
    """The id of the experiment to log to (Ray's order: id, then name, then made)."""
    if experiment_id is not None:
        try:
            if mlflow.get_experiment(experiment_id) is not None:
                return experiment_id
        except mlflow.exceptions.MlflowException:
            pass
    if name is not None:
        existing = mlflow.get_experiment_by_name(name)
        if existing is not None:
            return existing.experiment_id
        if create:
            return mlflow.create_experiment(name=name, artifact_location=location)
    raise ValueError(
        f"setup_mlflow found no MLflow experiment with id {experiment_id!r} or name {name!r}: "
        "make one and pass its `experiment_id` or `experiment_name`, or pass "
        "`create_experiment_if_not_exists=True`"
    )
