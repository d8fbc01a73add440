"""Ray's ``MLflowLoggerCallback``: an MLflow run per trial, from the driver.

    from popflow.air.integrations.mlflow import MLflowLoggerCallback
    tune.run(MyTrainable, ...,
             callbacks=[MLflowLoggerCallback("sqlite:///mlflow.db", experiment_name="exp")])

Needs the ``mlflow`` extra (``pip install 'popflow[mlflow]'``).
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from popflow.flows.events.callbacks import LoggerCallback
from popflow.flows.experiment.results import flatten
from popflow.flows.integrations.tensorboard import is_number, step_of
from popflow.infra.optional_imports import require
from popflow.schedulers import Trial

EXPERIMENT_ENV = ("MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID")


class MLflowLoggerCallback(LoggerCallback):
    """Ray's ``ray.air.integrations.mlflow.MLflowLoggerCallback``, with ``MlflowClient``.

    One run per trial in the experiment ``experiment_name`` (an existing one,
    or made; ``MLFLOW_EXPERIMENT_ID`` or ``MLFLOW_EXPERIMENT_NAME`` in the
    environment stand in for it, as in Ray), named ``str(trial)`` and tagged
    ``tags`` plus ``trial_name``. The trial's config, flattened with ``/``, is
    logged as params when its run starts (``log_params_on_trial_end``: when it
    ends, with the config it ended with). Every number of every result,
    flattened with ``/`` (``config/...`` too, as Ray does), is a metric at
    step ``timesteps_total`` or else ``training_iteration``. A run ends
    ``FINISHED``, or ``FAILED`` when its trial errored. ``tracking_token``
    goes to ``MLFLOW_TRACKING_TOKEN``, as in Ray.

    Unlike Ray, a resumed experiment goes on in each trial's run (the run ids
    are in the callback's committed state): results reported again after a
    crash appear twice at their step.

    ``save_artifact``: the trial's folder (``trial.path``, local or fsspec's
    remote, read with ``storage_options``) is logged as the run's artifacts
    once its logs are written: at the next round's start for local storage,
    at the experiment's end for remote storage (popflow writes ``result.json``
    at the round's commit, and to object stores every ``log_flush_interval``).
    """

    def __init__(
        self,
        tracking_uri: str | None = None,
        *,
        registry_uri: str | None = None,
        experiment_name: str | None = None,
        tags: dict[str, Any] | None = None,
        tracking_token: str | None = None,
        save_artifact: bool = False,
        log_params_on_trial_end: bool = False,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        require("mlflow", "mlflow", "MLflowLoggerCallback")
        if experiment_name is None and not any(os.environ.get(k) for k in EXPERIMENT_ENV):
            raise ValueError(
                "MLflowLoggerCallback needs `experiment_name` (or MLFLOW_EXPERIMENT_NAME or "
                "MLFLOW_EXPERIMENT_ID in the environment)"
            )
        if tags is not None and not isinstance(tags, dict):
            raise TypeError(f"`tags` must be a dict, got {tags!r}")
        if storage_options is not None and not isinstance(storage_options, dict):
            raise TypeError(f"`storage_options` must be a dict, got {storage_options!r}")
        self.tracking_uri = tracking_uri
        self.registry_uri = registry_uri
        self.experiment_name = experiment_name
        self.tags = dict(tags or {})
        self.should_save_artifact = save_artifact
        self.log_params_on_trial_end = log_params_on_trial_end
        self._tracking_token = tracking_token
        self._storage_options = dict(storage_options or {})
        self._client: Any = None
        self._experiment_id: str | None = None
        self._runs: dict[str, str] = {}  # trial_id -> run_id
        self._pending: list[list[str]] = []  # [run_id, trial folder]: artifacts to log

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info: Any) -> None:
        from mlflow.tracking import MlflowClient

        if self._tracking_token:
            os.environ["MLFLOW_TRACKING_TOKEN"] = self._tracking_token
        self._client = MlflowClient(tracking_uri=self.tracking_uri, registry_uri=self.registry_uri)
        self._experiment_id = self._experiment()

    def _experiment(self) -> str:
        """Ray's choice: ``MLFLOW_EXPERIMENT_ID`` if it exists, else the name's (made if new)."""
        from mlflow.exceptions import MlflowException

        env_id = os.environ.get("MLFLOW_EXPERIMENT_ID")
        if env_id:
            try:
                return self._client.get_experiment(env_id).experiment_id
            except MlflowException:
                pass
        name = self.experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME")
        if not name:
            raise ValueError(
                f"MLflow has no experiment {env_id!r} (MLFLOW_EXPERIMENT_ID) and no "
                "`experiment_name` is given"
            )
        found = self._client.get_experiment_by_name(name)
        return found.experiment_id if found else self._client.create_experiment(name)

    def log_trial_start(self, trial: Trial) -> None:
        run_id = self._runs.get(trial.trial_id)
        if run_id is not None:  # a resumed trial goes on in its run
            self._client.update_run(run_id, status="RUNNING")
            return
        tags = {**self.tags, "trial_name": str(trial)}
        run = self._client.create_run(self._experiment_id, run_name=str(trial), tags=tags)
        self._runs[trial.trial_id] = run.info.run_id
        if not self.log_params_on_trial_end:
            self._log_params(run.info.run_id, trial.config)

    def _log_params(self, run_id: str, config: dict[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(k, str(v)) for k, v in flatten(config).items()]
        self._client.log_batch(run_id, params=params)

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        if trial.trial_id not in self._runs:
            self.log_trial_start(trial)
        step, now = step_of(result), int(time.time() * 1000)
        metrics = [
            Metric(k, float(v), now, step) for k, v in flatten(result).items() if is_number(v)
        ]
        self._client.log_batch(self._runs[trial.trial_id], metrics=metrics)

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        if trial.trial_id not in self._runs:  # ended before it ran in this driver
            self.log_trial_start(trial)
        run_id = self._runs[trial.trial_id]
        if self.log_params_on_trial_end:
            self._log_params(run_id, trial.config)
        if self.should_save_artifact:
            self._pending.append([run_id, trial.path])
        self._client.set_terminated(run_id, status="FAILED" if failed else "FINISHED")

    def on_step_begin(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        self._log_artifacts(local_only=True)

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self._log_artifacts(local_only=False)

    def _log_artifacts(self, local_only: bool) -> None:
        waiting = []
        for run_id, path in self._pending:
            fs, root = fsspec.core.url_to_fs(path, **self._storage_options)
            if isinstance(fs, LocalFileSystem):
                self._client.log_artifacts(run_id, root)
            elif local_only:
                waiting.append([run_id, path])
            else:
                with tempfile.TemporaryDirectory(prefix="popflow-mlflow-") as tmp:
                    fs.get(root.rstrip("/") + "/", tmp + "/", recursive=True)
                    self._client.log_artifacts(run_id, tmp)
        self._pending = waiting

    def get_state(self) -> dict[str, Any] | None:
        return {"runs": self._runs, "pending": self._pending} if self._runs else None

    def set_state(self, state: dict[str, Any]) -> None:
        self._runs = dict(state.get("runs", {}))
        self._pending = [list(p) for p in state.get("pending", [])]
