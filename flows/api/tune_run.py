"""Ray Tune's legacy ``tune.run(trainable, config=..., ...)``, with Ray's keyword names.

It builds a :class:`~popflow.flows.api.tuner.Tuner` and fits it, so both doors
check and run alike. It returns the :class:`~popflow.flows.experiment.results.ResultGrid`,
which also answers Ray's ``ExperimentAnalysis`` names (``best_config``,
``best_result``, ``best_checkpoint``, ``results_df``, ``get_best_config``).
As Ray's, it raises :class:`TuneError` when a trial errored
(``raise_on_failed_trial=False``: it returns).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

from popflow.flows.api.tuner import FailureConfig, RunConfig, TuneConfig, Tuner, Unsupported
from popflow.flows.experiment.results import ResultGrid
from popflow.flows.spec.config import CheckpointConfig
from popflow.schedulers import TrialScheduler
from popflow.schedulers.validation import is_int

#: Ray's ``resume=`` strings, as what errored trials do (None: refused, as in Ray 2.x)
_RESUME = {"AUTO": "skip", "AUTO+ERRORED": "resume", "AUTO+RESTART_ERRORED": "restart"}


class TuneError(RuntimeError):
    """Ray's ``TuneError``: ``tune.run`` ended with errored trials."""


def tune_run(
    run_or_experiment: Any,
    *,
    name: str | None = None,
    metric: str | None = None,
    mode: str | None = None,
    stop: Mapping[str, Any] | Callable[[str, dict[str, Any]], bool] | Any = None,
    time_budget_s: float | None = None,
    config: dict[str, Any] | None = None,
    resources_per_trial: dict[str, float] | None = None,
    num_samples: int = 1,
    storage_path: str | None = None,
    search_alg: Any = None,
    scheduler: TrialScheduler | None = None,
    checkpoint_config: CheckpointConfig | None = None,
    verbose: int | None = None,
    progress_reporter: Any = None,
    log_to_file: bool | str = False,
    trial_name_creator: Callable[[Any], str] | None = None,
    trial_dirname_creator: Callable[[Any], str] | None = None,
    max_failures: int = 0,
    fail_fast: bool | str = False,
    resume: bool | str | None = None,
    reuse_actors: bool = False,
    raise_on_failed_trial: bool = True,
    callbacks: list[Any] | None = None,
    max_concurrent_trials: int | None = None,
    keep_checkpoints_num: int | None = None,
    checkpoint_score_attr: str | None = None,
    checkpoint_freq: int = 0,
    checkpoint_at_end: bool = False,
    seed: int | None = None,
    storage_options: dict[str, Any] | None = None,
    **ray_only: Any,
) -> ResultGrid:
    """Ray's ``tune.run``; ``seed`` and ``storage_options`` are popflow's own."""
    for argument, value in ray_only.items():
        if value is not None:
            raise Unsupported(argument, value, "it is Ray-only; drop it")
    if isinstance(run_or_experiment, str):
        raise Unsupported(
            "run_or_experiment", run_or_experiment, "pass the trainable itself (no registry)"
        )
    if resources_per_trial is not None:
        from popflow.flows.spec.config import with_resources

        with_resources(run_or_experiment, resources_per_trial)
    checkpoint_config = _legacy_checkpoint_config(
        checkpoint_config, keep_checkpoints_num, checkpoint_score_attr, checkpoint_freq,
        checkpoint_at_end,
    )  # fmt: skip
    tuner = Tuner(
        run_or_experiment,
        param_space=config,
        tune_config=TuneConfig(
            mode=mode,
            metric=metric,
            search_alg=search_alg,
            scheduler=scheduler,
            num_samples=num_samples,
            max_concurrent_trials=max_concurrent_trials,
            time_budget_s=time_budget_s,
            reuse_actors=reuse_actors,
            trial_name_creator=trial_name_creator,
            trial_dirname_creator=trial_dirname_creator,
            seed=seed,
        ),
        run_config=RunConfig(
            name=name,
            storage_path=storage_path,
            failure_config=FailureConfig(max_failures=max_failures, fail_fast=fail_fast),
            checkpoint_config=checkpoint_config,
            verbose=verbose,
            stop=stop,
            callbacks=callbacks,
            progress_reporter=progress_reporter,
            log_to_file=log_to_file,
            storage_options=storage_options,
        ),
    )
    grid = tuner.fit_resuming(_resume_mode(resume)) if resume else tuner.fit()
    if grid.num_errors and raise_on_failed_trial:
        failed = [r.trial_id for r in grid if r.error]
        raise TuneError(f"Trials did not complete: {failed}")
    return grid


def _resume_mode(resume: bool | str | None) -> str:
    """Ray's ``resume`` (True, "AUTO", "AUTO+ERRORED", ...) as what errored trials do."""
    if resume is True:
        return "skip"
    if isinstance(resume, str) and resume.upper() in _RESUME:
        return _RESUME[resume.upper()]
    raise Unsupported(
        "resume", resume, f"pass True, False or one of {sorted(_RESUME)} (Ray 2.x's values)"
    )


def _legacy_checkpoint_config(
    config: CheckpointConfig | None,
    keep: int | None,
    score_attr: str | None,
    freq: int,
    at_end: bool,
) -> CheckpointConfig | None:
    """Ray's deprecated checkpoint arguments, folded into a CheckpointConfig as Ray does
    (with its DeprecationWarning)."""
    changes: dict[str, Any] = {}
    if keep is not None:
        changes["num_to_keep"] = keep
    if score_attr is not None:
        if not isinstance(score_attr, str):
            raise TypeError(
                f"`checkpoint_score_attr` is {score_attr!r}, but must be a result key (a "
                "string, 'min-' before it to keep the lowest) or None"
            )
        low = score_attr.startswith("min-")
        changes["checkpoint_score_attribute"] = score_attr[4:] if low else score_attr
        changes["checkpoint_score_order"] = "min" if low else "max"
    # anything but the defaults goes to CheckpointConfig, which checks it (NaN, -1, "3")
    if not (is_int(freq) and freq == 0):
        changes["checkpoint_frequency"] = freq
    if at_end is not False:
        changes["checkpoint_at_end"] = at_end
    if not changes:
        return config
    warnings.warn(
        f"{sorted(changes)} passed to tune.run are deprecated (as in Ray): use checkpoint_config",
        DeprecationWarning,
        stacklevel=3,
    )
    base = config or CheckpointConfig()
    return CheckpointConfig(**{**base.__dict__, **changes})
