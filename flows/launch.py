"""``tune``: the Prefect flow that runs a population through its rounds.

Each round is a Prefect task (visible in the UI), the segments inside it are
raw Dask tasks (a Prefect task per member per round would cost more than the
training it schedules), and every round is committed to storage before the
next starts.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import json
import logging
import os
import random
import secrets
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import cloudpickle
import numpy as np
from distributed import Client

from popflow.flows.cli import save_tune_args
from popflow.flows.config import CheckpointConfig
from popflow.flows.controller import Controller, TrialRecord
from popflow.flows.results import Result, ResultGrid
from popflow.flows.resume import is_finished, restore_records
from popflow.flows.runner_pool import RunnerPool
from popflow.infra.cluster import ClusterStart, dask_client, dask_resources
from popflow.infra.experiment_log import EXPERIMENT_FILE, ExperimentLog
from popflow.infra.jsonutil import dumps
from popflow.infra.lease import Lease
from popflow.infra.storage import Storage
from popflow.schedulers import FIFOScheduler, Trial, TrialScheduler
from popflow.schedulers.variants import resolve_variants
from popflow.tasks.checkpoint import Checkpoint
from popflow.tasks.segment import is_function_trainable
from popflow.tasks.trainable import Trainable

logger = logging.getLogger("popflow")


def _round(controller: Controller) -> bool:
    """One round as a Prefect task: its summary and decisions show in the task's logs."""
    from prefect import get_run_logger

    more = controller.run_round()
    run_logger = get_run_logger()
    run_logger.info(controller.round_summary())
    for event in controller.last_commit["events"]:
        run_logger.info(event)
    return more


def _trainable_name(trainable: Any) -> str:
    return getattr(trainable, "__name__", type(trainable).__name__)


def _check_arguments(
    trainable: Any,
    num_samples: int,
    stop: Any,
    max_failures: int,
    commit_interval: float,
    scheduler: Any,
) -> None:
    if inspect.isclass(trainable):
        if not issubclass(trainable, Trainable):
            raise TypeError(
                f"`trainable` is the class {trainable.__name__}, which does not subclass popflow.Trainable"
            )
    elif not callable(trainable):
        raise TypeError(
            f"`trainable` must be a Trainable subclass or a function, got {trainable!r}"
        )
    if not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"`num_samples` is {num_samples!r}, but must be an int >= 1")
    if stop is not None and not (isinstance(stop, Mapping) or callable(stop)):
        raise TypeError(
            f"`stop` must be a dict, a callable (trial_id, result) -> bool, or None; got {stop!r}"
        )
    if not isinstance(max_failures, int) or max_failures < -1:
        raise ValueError(
            f"`max_failures` is {max_failures!r}, but must be an int >= -1 (-1: retry forever)"
        )
    if commit_interval <= 0:
        raise ValueError(f"`commit_interval` is {commit_interval}, but must be > 0")
    if not isinstance(scheduler, TrialScheduler):
        raise TypeError(f"`scheduler` must be a popflow.TrialScheduler, got {scheduler!r}")


def _new_records(
    trainable: Any,
    param_space: dict[str, Any],
    num_samples: int,
    scheduler: TrialScheduler,
    name: str,
    rng: np.random.Generator,
) -> list[TrialRecord]:
    prefix = hashlib.sha1(name.encode()).hexdigest()[:5]
    records = []
    for variant in resolve_variants(param_space, num_samples, rng):
        index = variant.index
        trial_id = f"{prefix}_{index:05d}"
        config = scheduler.complete_config(variant.config)
        trial = Trial(trial_id=trial_id, config=config, experiment_tag=variant.tag)
        records.append(
            TrialRecord(
                trial=trial, index=index, dirname=f"{_trainable_name(trainable)}_{trial_id}"
            )
        )
    return records


def _ship_by_value(trainable: Any) -> None:
    """Let workers unpickle a trainable whose module they cannot import by name.

    A module loaded from a file path (a Prefect deployment's entrypoint, a
    notebook cell) has no importable name, so cloudpickle must send its code.
    """
    name = getattr(trainable, "__module__", None) or ""
    module = sys.modules.get(name)
    if module is None or name == "__main__":
        return  # __main__ already travels by value
    try:
        importable = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        importable = False
    if not importable:
        cloudpickle.register_pickle_by_value(module)


def _is_flow_retry() -> bool:
    """True inside a Prefect flow run that is being retried (run_count > 1).

    Checked both where ``tune`` is called (a retried parent flow: its ``tune``
    subflow is a new run) and inside the ``tune`` flow (a retry of it).
    """
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    return bool(ctx and ctx.flow_run and ctx.flow_run.run_count > 1)


def _start(
    trainable: Any,
    param_space: dict[str, Any] | None,
    num_samples: int,
    scheduler: TrialScheduler,
    name: str,
    seed: int,
    exp_storage: Storage,
    log: ExperimentLog,
) -> list[TrialRecord]:
    """Sample the population and write its params; the scheduler gets the experiment's generator."""
    variant_seq, scheduler_seq = np.random.SeedSequence(seed).spawn(2)
    scheduler.set_rng(np.random.default_rng(scheduler_seq))
    # user callables in hyperparam_mutations / sample_from use the global RNGs
    random.seed(seed)
    np.random.seed(seed % 2**32)
    records = _new_records(
        trainable,
        dict(param_space or {}),
        num_samples,
        scheduler,
        name,
        np.random.default_rng(variant_seq),
    )
    for rec in records:
        scheduler.on_trial_add(rec.trial)
        exp_storage.write_text(
            dumps(rec.trial.config, indent=2, sort_keys=True), rec.dirname, "params.json"
        )
    return records


def _results(
    records: list[TrialRecord], storage: Storage, metric: str | None, mode: str | None
) -> ResultGrid:
    def ckpt(rec: TrialRecord, name: str) -> Checkpoint:
        return Checkpoint(storage.full_url(rec.checkpoint_path(name)), storage.storage_options)

    out = []
    for rec in records:
        latest = rec.checkpoints[-1].name if rec.checkpoints else None
        out.append(
            Result(
                config=rec.trial.config,
                metrics=rec.trial.last_result,
                checkpoint=ckpt(rec, latest) if latest else None,
                path=storage.full_url(rec.dirname),
                error=rec.error,
                trial_id=rec.trial_id,
                status=rec.trial.status.value,
                history=rec.results,
                best_checkpoints=[(ckpt(rec, c.name), c.result) for c in rec.checkpoints],
            )
        )
    return ResultGrid(out, metric, mode, storage.url)


def run(
    trainable: type[Trainable] | Callable[[dict[str, Any]], Any],
    param_space: dict[str, Any] | None = None,
    *,
    scheduler: TrialScheduler | None = None,
    num_samples: int = 1,
    metric: str | None = None,
    mode: str | None = None,
    stop: Mapping[str, Any] | Callable[[str, dict[str, Any]], bool] | None = None,
    checkpoint_config: CheckpointConfig | None = None,
    storage: str | os.PathLike[str] = "./results",
    storage_options: dict[str, Any] | None = None,
    name: str | None = None,
    seed: int | None = None,
    max_failures: int = 0,
    resources_per_trial: dict[str, float] | None = None,
    dask_address: str | Client | None = None,
    n_workers: int | None = None,
    commit_interval: float = 1.0,
    log_flush_interval: float = 30.0,
    resume: bool | str = False,
    lease_ttl: float = 60.0,
) -> ResultGrid:
    """Tune ``trainable`` over ``param_space`` with ``scheduler``; Ray Tune's ``Tuner.fit``.

    - ``trainable``: a :class:`popflow.tasks.Trainable` subclass or a function using
      :func:`popflow.tasks.report`.
    - ``param_space``: plain values and search spaces (``uniform``, ``choice``,
      ``grid_search``...); each grid point is sampled ``num_samples`` times.
    - ``stop``: a dict (stop when any ``result[key] >= value``) or a callable
      ``(trial_id, result) -> bool``; a result with ``done=True`` always stops.
    - ``storage``/``name``: results go to ``<storage>/<name>/`` (a local folder
      or any fsspec URL such as ``s3://bucket/prefix``).
    - ``seed``: drives trial sampling, the scheduler's generator and every
      segment's ``random``/``numpy`` seeds; synchronous runs repeat bit for bit.
    - ``resources_per_trial``: e.g. ``{"cpu": 2, "gpu": 1}``, held as Dask
      worker resources by every segment; fails fast if no worker can hold one.
    - ``dask_address``: an existing Dask scheduler (address or Client); otherwise a LocalCluster
      with ``n_workers`` process workers (default: one per core).
    - ``resume``: True continues the experiment ``<storage>/<name>`` from its
      last committed round (pass the same trainable and a scheduler built with
      the same arguments); "auto" resumes if there is one, else starts. A
      Prefect retry of this flow run resumes by itself. A finished experiment
      is not run again: its results are returned.
    - ``lease_ttl``: seconds a crashed driver's lease blocks another driver.
    - ``log_flush_interval``: on object stores, seconds between rewrites of
      result.json / progress.csv / pbt_global.txt (each commit holds its own
      results, so nothing is lost in between); local files are appended at once.
    """
    root = Storage(storage, storage_options)
    if not resume and _is_flow_retry():  # a retried flow run that calls tune: pick up its work
        resume = "auto"
    _check_arguments(
        trainable,
        num_samples,
        stop,
        max_failures,
        commit_interval,
        scheduler if scheduler is not None else FIFOScheduler(),
    )
    options = {k: v for k, v in locals().items() if k not in _NOT_OPTIONS}
    if dask_address is not None:
        return _prefect().tune_flow(trainable, param_space, root, name, options)
    # the embedded cluster starts while Prefect creates the flow run
    cluster = ClusterStart(n_workers)
    try:
        return _prefect().tune_flow(
            trainable, param_space, root, name, {**options, "dask_address": cluster}
        )
    finally:
        cluster.close()


_NOT_OPTIONS = ("trainable", "param_space", "storage", "storage_options", "root", "name")


def tune_flow(
    trainable: type[Trainable] | Callable[[dict[str, Any]], Any],
    param_space: dict[str, Any] | None,
    storage: Storage,
    name: str | None,
    options: dict[str, Any],
) -> ResultGrid:
    """The Prefect flow behind :func:`tune`.

    It takes a :class:`~popflow.infra.storage.Storage` rather than the storage
    options, so credentials never become flow-run parameters in Prefect's
    database; ``options`` are :func:`tune`'s other keyword arguments.
    """
    return _run(trainable, param_space, storage=storage, name=name, **options)


class _PrefectObjects(NamedTuple):
    tune_flow: Any  # prefect.Flow
    round_task: Any  # prefect.Task


@functools.cache
def _prefect() -> _PrefectObjects:
    """The ``tune`` flow and its ``round`` task, made on first use.

    Every Dask worker imports the user's script, and so popflow; Prefect
    stays out of that import (it costs a worker ~1 s of CPU and ~45 MB),
    since workers never use it.
    """
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE

    return _PrefectObjects(
        tune_flow=flow(name="tune", validate_parameters=False)(tune_flow),
        round_task=task(name="round", cache_policy=NO_CACHE)(_round),
    )


def _run(
    trainable: type[Trainable] | Callable[[dict[str, Any]], Any],
    param_space: dict[str, Any] | None = None,
    *,
    scheduler: TrialScheduler | None = None,
    num_samples: int = 1,
    metric: str | None = None,
    mode: str | None = None,
    stop: Mapping[str, Any] | Callable[[str, dict[str, Any]], bool] | None = None,
    checkpoint_config: CheckpointConfig | None = None,
    storage: Storage,
    name: str | None = None,
    seed: int | None = None,
    max_failures: int = 0,
    resources_per_trial: dict[str, float] | None = None,
    dask_address: str | Client | ClusterStart | None = None,
    n_workers: int | None = None,
    commit_interval: float = 1.0,
    log_flush_interval: float = 30.0,
    resume: bool | str = False,
    lease_ttl: float = 60.0,
) -> ResultGrid:
    """Run (or resume) the experiment ``<storage>/<name>``; see :func:`tune`."""
    scheduler = scheduler if scheduler is not None else FIFOScheduler()
    _check_arguments(trainable, num_samples, stop, max_failures, commit_interval, scheduler)
    _ship_by_value(trainable)
    if resume not in (False, True, "auto"):
        raise ValueError(f"`resume` is {resume!r}, but must be False, True or 'auto'")
    if not scheduler.set_search_properties(metric, mode):
        raise ValueError(
            "`metric`/`mode` were passed to tune() but the scheduler already has its own; "
            "set them in one place only"
        )
    metric, mode = scheduler.metric, scheduler.mode
    resources = dask_resources(resources_per_trial)
    checkpoint_config = checkpoint_config or CheckpointConfig()
    name = name or f"{_trainable_name(trainable)}_{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    exp_storage = storage.child(name)
    log = ExperimentLog(exp_storage)
    latest = log.latest()
    resume = resume or ("auto" if _is_flow_retry() else False)
    if latest is not None and not resume:
        state = "a finished" if is_finished(latest) else "an unfinished"
        raise ValueError(
            f"{state} experiment named {name!r} already exists at {exp_storage.url}; "
            "resume it (tune(..., resume=True) or `popflow resume`) or choose another `name`"
        )
    if latest is None and resume is True:
        raise ValueError(f"nothing to resume: no committed experiment at {exp_storage.url}")
    if latest is not None and is_finished(latest):
        logger.info("%s already finished; returning its results", name)
        return _results(restore_records(exp_storage, latest, log), exp_storage, metric, mode)

    with Lease(exp_storage, lease_ttl):
        if latest is not None:
            seed = int(json.loads(exp_storage.read_text(EXPERIMENT_FILE))["seed"])
            scheduler.set_rng(np.random.default_rng(np.random.SeedSequence(seed).spawn(2)[1]))
            scheduler.set_state(latest["scheduler"])
            records = restore_records(exp_storage, latest, log)
            logger.info(
                "%s: resuming after round %d from %s", name, latest["round"], exp_storage.url
            )
        else:
            if seed is None:
                seed = secrets.randbits(32)
            save_tune_args(
                exp_storage,
                {  # the scheduler already carries metric and mode
                    "trainable": trainable,
                    "param_space": param_space,
                    "scheduler": scheduler,
                    "num_samples": num_samples,
                    "stop": stop,
                    "checkpoint_config": checkpoint_config,
                    "seed": seed,
                    "max_failures": max_failures,
                    "resources_per_trial": resources_per_trial,
                    "commit_interval": commit_interval,
                    "log_flush_interval": log_flush_interval,
                    "lease_ttl": lease_ttl,
                },
            )
            records = _start(
                trainable, param_space, num_samples, scheduler, name, seed, exp_storage, log
            )
            log.write_experiment(
                {
                    "name": name,
                    "seed": seed,
                    "trainable": _trainable_name(trainable),
                    "scheduler": type(scheduler).__name__,
                    "metric": metric,
                    "mode": mode,
                    "num_trials": len(records),
                    "created": time.time(),
                }
            )
            logger.info(
                "%s: %d trials, %s, results in %s (seed %d)",
                name,
                len(records),
                scheduler.debug_string(),
                exp_storage.url,
                seed,
            )
        checkpoint_at_end = (
            checkpoint_config.checkpoint_at_end
            if checkpoint_config.checkpoint_at_end is not None
            else not is_function_trainable(trainable)
        )
        with dask_client(dask_address, n_workers) as client:
            pool = RunnerPool(client, resources)
            controller = Controller(
                trainable=trainable,
                records=records,
                scheduler=scheduler,
                storage=exp_storage,
                log=log,
                pool=pool,
                seed=seed,
                stop=stop,
                checkpoint_config=checkpoint_config,
                checkpoint_at_end=checkpoint_at_end,
                max_failures=max_failures,
                commit_interval=commit_interval,
                log_flush_interval=log_flush_interval,
            )
            if latest is not None:
                controller.resume_from(latest)
            else:
                controller.commit()  # round 0: the sampled population, before any training
            try:
                round_no = controller.rounds + 1
                round_task = _prefect().round_task
                while round_task.with_options(task_run_name=f"round-{round_no}")(controller):
                    round_no += 1
            finally:
                controller.cancel()
                pool.close()
    grid = _results(records, exp_storage, metric, mode)
    stuck = [r.trial_id for r in records if r.trial.is_live]
    if stuck:
        logger.warning(
            "%d trials never finished (the scheduler chose none to run): %s", len(stuck), stuck
        )
    logger.info(
        "%s finished: %d trials, %d errors; %s",
        name,
        len(grid),
        grid.num_errors,
        scheduler.debug_string(),
    )
    return grid
