"""A deployable flow for any experiment: everything it takes is JSON, so a run can be
started from the Prefect UI (or ``prefect deployment run --param ...``) with parameters.

    entrypoint: flows/record/deployable.py:experiment        (in prefect.yaml)

- ``trainable``: an import path, ``"mypkg.train:MyTrainable"`` (a Trainable class or a
  function of a config); its package must be importable where the flow runs (and on the
  workers, unless it is a file of the user's own, which popflow sends). Whoever may
  start the deployment chooses it, so it must be under the deployment owner's
  allowlist: ``POPFLOW_TRAINABLE_ALLOWLIST`` in the environment where the flow runs,
  comma-separated import prefixes (``mypkg``, ``mypkg.train:MyTrainable``, ``*`` for
  any); unset, only popflow's demo trainable (``popflow.tune.utils.mock_trainable``)
  runs. A path outside it is refused before its module is imported, and anything but
  a Trainable subclass or a function of a config is refused
  (:mod:`popflow.flows.spec.trainable_paths`).
- ``param_space``: plain values, and search spaces written as one-key objects naming
  the function and its arguments: ``{"lr": {"loguniform": [1e-4, 1e-1]}, "bs":
  {"choice": [[16, 32, 64]]}, "seed": {"grid_search": [[0, 1]]}, "layers": 2}``.
- ``scheduler``: ``fifo``, ``asha``, ``hyperband``, ``median``, ``pbt``, ``pb2``, with
  ``scheduler_args`` as keyword arguments (Ray's names). In PBT's
  ``hyperparam_mutations`` a search space is written as in ``param_space`` and a list
  is a categorical set; PB2's ``hyperparam_bounds`` are ``[low, high]`` lists.
- ``storage``: a folder or URL under the owner's storage allowlist,
  ``POPFLOW_STORAGE_ALLOWLIST`` where the flow runs (comma-separated folders or URL
  prefixes such as ``s3://bucket/prefix``, ``*`` for any); unset, ``./results`` only.
  A resume reads what it finds there (checkpoints a trainable loads), so storage
  outside it is refused before anything is read
  (:mod:`popflow.flows.spec.storage_roots`). Never credentials: those come from the AWS
  chain or a Prefect block.
- the rest as ``popflow.run``'s: ``metric``, ``mode``, ``num_samples``, ``stop``,
  ``name`` (templates such as ``"exp_{date}"``), ``seed``, ``max_rounds``,
  ``run_budget_s`` (seconds of each run: the experiment stays resumable; Ray's
  ``time_budget_s``, which ends the experiment, is not a parameter here), ``resume``
  ("auto": each trigger continues the experiment),
  ``dask_address``, checkpointing and ``max_failures``.
- ``credentials_block``: the name of a prefect-aws block holding the S3 credentials,
  ``"aws-credentials/NAME"`` (or plain ``"NAME"``), ``"minio-credentials/NAME"`` or
  ``"s3-bucket/NAME"`` (its credentials); ``storage`` is then an ``s3://`` URL. The
  flow run loads the block (``pip install 'popflow[aws]'``): only its name is a
  parameter, and the keys never reach Prefect's parameters or logs
  (:mod:`popflow.infra.storage.aws_blocks`). Without one, s3fs's default applies: environment
  variables, then the rest of the AWS chain, on the driver and every worker.

This module imports Prefect; ``popflow`` itself does not import it (Dask workers do
not need it). Users who prefer their own flow write one as
``examples/pbt_benchmark_flow.py`` does: a ``@flow`` function calling ``popflow.run``.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.states import Completed

from popflow import CheckpointConfig, run
from popflow.flows.record.flow_retries import mistakes_not_retried
from popflow.flows.record.plot_artifacts import plots_artifact
from popflow.flows.spec import storage_roots, trainable_paths
from popflow.infra.storage.options_cli import resolve_storage_options
from popflow.schedulers import (
    PB2,
    ASHAScheduler,
    FIFOScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    PopulationBasedTraining,
    TrialScheduler,
    search_space,
)

SCHEDULERS: dict[str, type[TrialScheduler]] = {
    "fifo": FIFOScheduler,
    "asha": ASHAScheduler,
    "hyperband": HyperBandScheduler,
    "median": MedianStoppingRule,
    "pbt": PopulationBasedTraining,
    "pb2": PB2,
}

#: The search-space functions a JSON ``param_space`` may name.
SPACES = (
    "uniform",
    "quniform",
    "loguniform",
    "qloguniform",
    "randn",
    "qrandn",
    "randint",
    "qrandint",
    "lograndint",
    "qlograndint",
    "choice",
    "grid_search",
)


def load_trainable(path: str) -> Any:
    """``"package.module:Name"`` -> the trainable, if this deployment may run it: the path
    is under the owner's allowlist (``POPFLOW_TRAINABLE_ALLOWLIST`` where the flow runs;
    unset, popflow's demo trainable only), checked before anything is imported, and
    the object is a Trainable subclass or a function of a config. Else a ValueError
    saying which (:mod:`popflow.flows.spec.trainable_paths`)."""
    return trainable_paths.load_trainable(path, trainable_paths.allowlist())


def decode_space(value: Any, where: str = "param_space") -> Any:
    """JSON search spaces (``{"loguniform": [1e-4, 1e-1]}``) as popflow's; nested dicts
    and plain values as they are."""
    if isinstance(value, dict):
        if len(value) == 1:
            ((key, args),) = value.items()
            if key in SPACES:
                if not isinstance(args, list):
                    raise ValueError(
                        f"`{where}`: {{{key!r}: {args!r}}} needs a list of arguments, "
                        f"e.g. {{{key!r}: [...]}}"
                    )
                return getattr(search_space, key)(*args)
        return {k: decode_space(v, f"{where}.{k}") for k, v in value.items()}
    return value


def make_scheduler(name: str, args: dict[str, Any] | None) -> TrialScheduler:
    if name not in SCHEDULERS:
        raise ValueError(f"`scheduler` is {name!r}, but must be one of {sorted(SCHEDULERS)}")
    kwargs = dict(args or {})
    if "hyperparam_mutations" in kwargs:
        kwargs["hyperparam_mutations"] = decode_space(
            kwargs["hyperparam_mutations"], "hyperparam_mutations"
        )
    try:
        return SCHEDULERS[name](**kwargs)
    except TypeError as e:
        raise ValueError(f"`scheduler_args` for {name!r}: {e}") from None


@flow(name="popflow-experiment", validate_parameters=True, retries=2, retry_delay_seconds=10)
def experiment(
    trainable: str,
    param_space: dict[str, Any] | None = None,
    scheduler: str = "fifo",
    scheduler_args: dict[str, Any] | None = None,
    metric: str | None = None,
    mode: str | None = None,
    num_samples: int = 1,
    stop: dict[str, float] | None = None,
    storage: str = "./results",
    name: str = "experiment",
    seed: int | None = None,
    max_rounds: int | None = None,
    run_budget_s: float | None = None,
    resume: str = "auto",
    dask_address: str | None = None,
    checkpoint_frequency: int = 0,
    num_to_keep: int | None = None,
    max_failures: int = 0,
    credentials_block: str | None = None,
    plots: bool = True,
) -> Any:
    """Tune ``trainable`` over ``param_space``; the best trial's config and metrics, where
    the experiment lives, and whether it has finished (or only this run's budget). The
    flow run's final state says how the run ended, as its ``tune`` subflow's does.
    ``plots``: draw the experiment's plots at the end, into ``<experiment>/plots`` and
    onto the Artifacts page (``<name>-plots``; needs ``popflow[plots]``).

    A mistake in the parameters (a ``ValueError``/``TypeError`` of an argument check, a
    trainable that is not allowed) fails the flow run at once, without its retries
    (:mod:`popflow.flows.record.flow_retries`); other failures are retried."""
    with mistakes_not_retried():
        # the caller's storage is read (a resume loads its checkpoints): only the owner's
        # roots, checked before anything is read
        storage_roots.check_storage(storage)
        storage_options = resolve_storage_options(storage, None, credentials_block)
        grid = run(
            load_trainable(trainable),
            decode_space(param_space or {}),
            scheduler=make_scheduler(scheduler, scheduler_args),
            metric=metric,
            mode=mode,
            num_samples=num_samples,
            stop=stop,
            checkpoint_config=CheckpointConfig(
                checkpoint_frequency=checkpoint_frequency, num_to_keep=num_to_keep
            ),
            storage=storage,
            storage_options=storage_options,
            name=name,
            seed=seed,
            max_rounds=max_rounds,
            run_budget_s=run_budget_s,
            resume=resume,
            dask_address=dask_address,
            max_failures=max_failures,
        )
    finished = all(r.status in ("TERMINATED", "ERROR") for r in grid)
    out: dict[str, Any] = {"experiment": grid.experiment_path, "finished": finished}
    if plots:
        out["plots"] = plots_artifact(
            grid.experiment_path.rstrip("/").rsplit("/", 1)[-1],
            grid.experiment_path,
            storage_options,
        )
    try:
        best = grid.get_best_result()
    except (RuntimeError, ValueError):  # no metric, or nothing reported yet
        return Completed(message=grid.summary, data=out)
    return Completed(
        message=grid.summary,
        data={**out, "best_config": best.config, "best_metrics": best.metrics},
    )
