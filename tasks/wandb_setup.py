"""Ray's Weights & Biases helpers shared by the driver's callback and the trainable's
``setup_wandb``: the API key, the project, and a config or result cleaned into what
``wandb`` logs (numpy images and videos as ``wandb.Image``/``wandb.Video``).

    from popflow.air.integrations.wandb import setup_wandb
    def train_fn(config):
        run = setup_wandb(config, project="my-project")
        for step in range(10):
            run.log({"loss": 1 / (step + 1)})
            tune.report({"loss": 1 / (step + 1)})

Needs the ``wandb`` extra. ``setup_wandb`` opens the trial's run (id: the trial's id,
name: its name, group: the experiment's) with ``config`` as the run's config; the run
finishes with the trial (failed: exit code 1).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from popflow.infra.optional_imports import require
from popflow.tasks.trial_context import at_discard, get_context

API_KEY_ENV = "WANDB_API_KEY"
PROJECT_ENV = "WANDB_PROJECT"
GROUP_ENV = "WANDB_RUN_GROUP"
MODE_ENV = "WANDB_MODE"


def set_api_key(api_key_file: str | None = None, api_key: str | None = None) -> None:
    """Ray's order: the arguments, ``WANDB_API_KEY``, a ``wandb login``; none of them
    needed in offline or disabled mode. Found nowhere: a named error."""
    if os.environ.get(MODE_ENV) in {"offline", "disabled"}:
        return
    if api_key_file:
        if api_key:
            raise ValueError("Both WandB `api_key_file` and `api_key` set.")
        with open(os.path.expanduser(api_key_file)) as f:
            api_key = f.readline().strip()
    if api_key:
        os.environ[API_KEY_ENV] = api_key
        return
    if os.environ.get(API_KEY_ENV):
        return
    wandb = require("wandb", "wandb", "W&B logging")
    if getattr(getattr(wandb, "api", None), "api_key", None):
        return  # logged in with `wandb login`
    raise ValueError(
        f"No WandB API key found. Either set the {API_KEY_ENV} environment variable, pass "
        "`api_key` or `api_key_file`, or run `wandb login` from the command line"
    )


def project_of(project: str | None) -> str | None:
    return project or os.environ.get(PROJECT_ENV) or None


def clean(obj: Any, video_kwargs: dict[str, Any], image_kwargs: dict[str, Any]) -> Any:
    """``obj`` as ``wandb`` logs it (Ray's rules): (H, W, C) arrays as images, (N, H, W,
    C) as images, (N, T, C, W, H) as videos; what JSON cannot hold as its string."""
    wandb = require("wandb", "wandb", "W&B logging")
    if isinstance(obj, dict):
        return {k: clean(v, video_kwargs, image_kwargs) for k, v in obj.items()}
    if isinstance(obj, list | set | tuple):
        out = [clean(v, video_kwargs, image_kwargs) for v in obj]
        return tuple(out) if isinstance(obj, tuple) else out
    if isinstance(obj, np.ndarray) and obj.ndim in (3, 4, 5):
        kind, kwargs = (wandb.Video, video_kwargs) if obj.ndim == 5 else (wandb.Image, image_kwargs)
        if obj.ndim == 3:
            return wandb.Image(obj, **kwargs)
        items = [kind(v, **kwargs) for v in obj]
        return items if len(items) > 1 else items[0]
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(
        obj, str | int | float | bool | wandb.sdk.data_types.base_types.wb_value.WBValue
    ):
        return obj
    try:
        json.dumps(obj)
        return obj
    except (TypeError, ValueError):
        return str(obj)


def setup_wandb(
    config: dict[str, Any] | None = None,
    api_key: str | None = None,
    api_key_file: str | None = None,
    rank_zero_only: bool = True,
    **kwargs: Any,
) -> Any:
    """Ray's ``setup_wandb``: the trial's W&B run (``wandb.init``'s ``kwargs`` take
    precedence); ``rank_zero_only`` is Ray Train's and has no effect in a trial."""
    wandb = require("wandb", "wandb", "setup_wandb")
    try:
        context = get_context()
        defaults = {
            "id": context.get_trial_id(),
            "name": context.get_trial_name(),
            "group": context.get_experiment_name(),
        }
    except RuntimeError:  # outside a trial: wandb's own defaults
        context, defaults = None, {}
    set_api_key(api_key_file, api_key)
    init = {
        **defaults,
        "project": project_of(kwargs.pop("project", None)),
        "config": clean(dict(config or {}), {}, {}),
        "resume": "allow",
        "reinit": "create_new",  # a worker runs many trials, each its own run
        "allow_val_change": True,
        **kwargs,
    }
    if init.get("group") is None and os.environ.get(GROUP_ENV):
        init["group"] = os.environ[GROUP_ENV]
    run = wandb.init(**init)
    if context is not None:
        at_discard(lambda failed: run.finish(exit_code=1 if failed else 0))
    return run
