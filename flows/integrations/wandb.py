"""Ray's ``WandbLoggerCallback``: a Weights & Biases run per trial, from the driver.

    from popflow.air.integrations.wandb import WandbLoggerCallback
    tune.run(train, ..., callbacks=[WandbLoggerCallback(project="my-project")])

Needs the ``wandb`` extra (``pip install 'popflow[wandb]'``). Ray starts a logging
actor per trial; here the driver holds one run per trial (``wandb.init(reinit=
"create_new")``): id the trial's id, name its name, group ``group`` or the experiment's
name, config its config (``excludes`` left out). Each result's numbers (and images,
videos) are logged at step ``training_iteration``; Ray's auto-filled keys go to the
run's config; ``done`` and ``should_checkpoint`` are not logged, nor the result's
``config`` unless ``log_config``. ``upload_checkpoints`` logs each local checkpoint
folder as a ``model`` artifact. A run finishes with its trial (failed: exit code 1). A
resumed experiment goes on in each trial's run (``resume="allow"``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from popflow.flows.events.callbacks import LoggerCallback
from popflow.infra.optional_imports import require
from popflow.schedulers import Trial
from popflow.schedulers.search_space import flat_keys
from popflow.tasks.wandb_setup import GROUP_ENV, PROJECT_ENV, clean, project_of, set_api_key

logger = logging.getLogger(__name__)


class WandbLoggerCallback(LoggerCallback):
    """Ray's ``ray.air.integrations.wandb.WandbLoggerCallback`` (its arguments; ``kwargs``
    go to ``wandb.init``)."""

    #: never logged (Ray's)
    _exclude_results = ["done", "should_checkpoint"]
    #: results kept in the run's config, not logged (Ray's)
    AUTO_CONFIG_KEYS = [
        "trial_id",
        "experiment_tag",
        "node_ip",
        "experiment_id",
        "hostname",
        "pid",
        "date",
    ]

    def __init__(
        self,
        project: str | None = None,
        group: str | None = None,
        api_key_file: str | None = None,
        api_key: str | None = None,
        excludes: list[str] | None = None,
        log_config: bool = False,
        upload_checkpoints: bool = False,
        save_checkpoints: bool = False,
        upload_timeout: int = 1800,
        video_kwargs: dict[str, Any] | None = None,
        image_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        require("wandb", "wandb", "WandbLoggerCallback")
        if excludes is not None and not isinstance(excludes, list | tuple):
            raise TypeError(f"`excludes` is {excludes!r}, but must be a list of keys")
        if save_checkpoints:
            logger.warning("`save_checkpoints` is deprecated: use `upload_checkpoints`")
        self.project = project
        self.group = group
        self.api_key_path = api_key_file
        self.api_key = api_key
        self.excludes = list(excludes or [])
        self.log_config = log_config
        self.upload_checkpoints = upload_checkpoints or save_checkpoints
        self.upload_timeout = upload_timeout
        self.video_kwargs = dict(video_kwargs or {})
        self.image_kwargs = dict(image_kwargs or {})
        self.kwargs = kwargs
        self._runs: dict[str, Any] = {}  # trial id -> its open wandb run
        self._started: set[str] = set()  # trials whose run was made (committed)

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info: Any) -> None:
        set_api_key(self.api_key_path, self.api_key)
        self.project = project_of(self.project)
        if not self.project:
            raise ValueError(
                "Please pass the project name as argument or through the "
                f"{PROJECT_ENV} environment variable."
            )
        if not self.group and os.environ.get(GROUP_ENV):
            self.group = os.environ[GROUP_ENV]

    def log_trial_start(self, trial: Trial) -> None:
        if trial.trial_id in self._runs:
            return
        wandb = require("wandb", "wandb", "WandbLoggerCallback")
        config = {k: v for k, v in dict(trial.config).items() if k not in self.excludes}
        config.pop("callbacks", None)
        init = {
            "id": trial.trial_id,
            "name": str(trial),
            "group": self.group or _experiment_of(trial),
            "project": self.project,
            "config": clean(config, self.video_kwargs, self.image_kwargs),
            # a resumed experiment goes on in its runs
            "resume": "allow" if trial.trial_id in self._started else None,
            "reinit": "create_new",
            "allow_val_change": True,
            **self.kwargs,
        }
        self._runs[trial.trial_id] = wandb.init(**init)
        self._started.add(trial.trial_id)

    def log_trial_result(self, iteration: int, trial: Trial, result: dict[str, Any]) -> None:
        if trial.trial_id not in self._runs:
            self.log_trial_start(trial)
        run = self._runs[trial.trial_id]
        log, config_update = self._split(clean(result, self.video_kwargs, self.image_kwargs))
        if config_update:
            run.config.update(config_update, allow_val_change=True)
        run.log(log, step=result.get("training_iteration"))

    def _split(self, result: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(what is logged, what goes to the run's config), as Ray splits a result."""
        excluded = self._exclude_results + self.excludes + ([] if self.log_config else ["config"])
        wandb = require("wandb", "wandb", "WandbLoggerCallback")
        log: dict[str, Any] = {}
        config: dict[str, Any] = {}
        for key, value in flat_keys(result).items():
            if any(key == item or key.startswith(item + "/") for item in excluded):
                continue
            if any(key == item or key.startswith(item + "/") for item in self.AUTO_CONFIG_KEYS):
                config[key] = value
            elif (
                isinstance(value, bool)
                or not isinstance(
                    value, int | float | wandb.sdk.data_types.base_types.wb_value.WBValue | list
                )
                or (
                    isinstance(value, list)
                    and not all(isinstance(v, wandb.Image | wandb.Video) for v in value)
                )
            ):
                continue
            else:
                log[key] = value
        return log, config

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info: Any) -> None:
        if not self.upload_checkpoints or trial.trial_id not in self._runs:
            return
        path = getattr(checkpoint, "path", None)
        if not path or "://" in str(path) or not os.path.isdir(path):
            logger.info("W&B: checkpoint %s is not a local folder: not uploaded", path)
            return
        wandb = require("wandb", "wandb", "WandbLoggerCallback")
        artifact = wandb.Artifact(name=f"checkpoint_{trial}", type="model")  # Ray's name
        artifact.add_dir(str(path))
        self._runs[trial.trial_id].log_artifact(artifact)

    def log_trial_end(self, trial: Trial, failed: bool = False) -> None:
        run = self._runs.pop(trial.trial_id, None)
        if run is not None:
            run.finish(exit_code=1 if failed else 0)

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        for trial_id in list(self._runs):
            self._runs.pop(trial_id).finish()

    def get_state(self) -> dict[str, Any] | None:
        return {"started": sorted(self._started)} if self._started else None

    def set_state(self, state: dict[str, Any]) -> None:
        self._started = set(state.get("started", []))


def _experiment_of(trial: Trial) -> str | None:
    """The experiment's name: its folder's, which holds the trial's (Ray's group)."""
    path = (getattr(trial, "path", None) or "").rstrip("/")
    return os.path.basename(os.path.dirname(path)) or None
