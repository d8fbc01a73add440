"""A run's arguments, checked once: :func:`run_spec` turns ``popflow.run``'s keyword
arguments into a frozen :class:`RunSpec` before Prefect or the cluster starts.

Every later layer takes the spec, so no signature is repeated and no argument
is checked twice; a bad argument fails with a message naming it and its value
before anything is written.
"""

from __future__ import annotations

import inspect
import math
import numbers
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from distributed import Client

from popflow.flows.events.callbacks import check_callbacks
from popflow.flows.spec.config import CheckpointConfig, check_resources, check_verbose
from popflow.flows.spec.experiment_name import check_experiment_path, check_name, expand_name
from popflow.infra.cluster.dask_cluster import dask_resources
from popflow.infra.storage.folder import Storage
from popflow.infra.store.layout import LOG_DIR
from popflow.schedulers import FIFOScheduler, TrialScheduler
from popflow.schedulers.domains import Categorical
from popflow.schedulers.validation import check_real, is_int
from popflow.tasks.specs import StopCondition
from popflow.tasks.trainable import Trainable, is_function_trainable

RESUME_VALUES = (False, True, "auto")


def trainable_name(trainable: Any) -> str:
    return getattr(trainable, "__name__", type(trainable).__name__)


@dataclass(frozen=True)
class RunSpec:
    """What one experiment runs, as validated from ``popflow.run``'s arguments.

    ``storage`` is the root (credentials hidden, see
    :mod:`popflow.infra.storage.credentials`); the experiment lives at
    ``storage.child(name)``. ``metric``/``mode`` are the scheduler's.
    ``resources`` are ``resources_per_trial`` in Dask's names.
    """

    trainable: type[Trainable] | Callable[[dict[str, Any]], Any]
    param_space: dict[str, Any]
    scheduler: TrialScheduler
    num_samples: int
    stop: StopCondition
    checkpoint_config: CheckpointConfig
    storage: Storage
    name: str
    seed: int | None
    max_failures: int
    resources_per_trial: dict[str, float] | None
    resources: dict[str, float] | None
    dask_address: str | Client | None
    n_workers: int | None
    commit_interval: float
    log_flush_interval: float
    resume: bool | str
    lease_ttl: float
    segment_timeout_s: float | None = None
    fail_fast: bool | str = False
    time_budget_s: float | None = None
    max_rounds: int | None = None
    max_concurrent_trials: int | None = None
    #: Ray's ``tune.Callback`` objects, called on the driver (never pickled into a commit)
    callbacks: tuple[Any, ...] = ()
    trial_name_creator: Callable[[Any], str] | None = None
    trial_dirname_creator: Callable[[Any], str] | None = None
    #: on resume, errored trials: "skip" (stay errored), "resume" (from their last
    #: checkpoint) or "restart" (from scratch); Ray's ``resume_errored``/``restart_errored``
    errored: str = "skip"
    #: Ray's ``verbose`` as given (None: the default); see :mod:`popflow.flows.console.verbose`
    verbose: int | None = None

    @property
    def metric(self) -> str | None:
        return self.scheduler.metric

    @property
    def mode(self) -> str | None:
        return self.scheduler.mode

    @property
    def experiment_storage(self) -> Storage:
        return self.storage.child(self.name)

    @property
    def checkpoint_at_end(self) -> bool:
        """Ray's default: class trainables save at the end, function trainables report theirs."""
        if self.checkpoint_config.checkpoint_at_end is not None:
            return self.checkpoint_config.checkpoint_at_end
        return not is_function_trainable(self.trainable)

    def run_args(self, seed: int) -> dict[str, Any]:
        """What ``popflow resume`` passes to ``run`` again (no storage, so no secrets)."""
        return {  # the scheduler already carries metric and mode
            "trainable": self.trainable,
            "param_space": self.param_space,
            "scheduler": self.scheduler,
            "num_samples": self.num_samples,
            "stop": self.stop,
            "checkpoint_config": self.checkpoint_config,
            "seed": seed,
            "max_failures": self.max_failures,
            "resources_per_trial": self.resources_per_trial,
            "commit_interval": self.commit_interval,
            "log_flush_interval": self.log_flush_interval,
            "lease_ttl": self.lease_ttl,
            "segment_timeout_s": self.segment_timeout_s,
            "fail_fast": self.fail_fast,
            "time_budget_s": self.time_budget_s,
            "max_rounds": self.max_rounds,
            "max_concurrent_trials": self.max_concurrent_trials,
            "callbacks": list(self.callbacks) or None,
            # an address, not a Client: a Client's cluster may live only as long as its process
            "dask_address": self.dask_address if isinstance(self.dask_address, str) else None,
        }


def _check_trainable(trainable: Any) -> None:
    if inspect.isclass(trainable):
        if not issubclass(trainable, Trainable):
            raise TypeError(
                f"`trainable` is the class {trainable.__name__}, which does not subclass "
                "popflow.Trainable"
            )
    elif not callable(trainable):
        raise TypeError(
            f"`trainable` must be a Trainable subclass or a function, got {trainable!r}"
        )


def _check_function_checkpoints(config: CheckpointConfig) -> None:
    """Ray's rule: a function trainable reports its own checkpoints."""
    if config.checkpoint_at_end:
        raise ValueError(
            "'checkpoint_at_end' cannot be used with a function trainable. You should include "
            "one last call to `tune.report(metrics=..., checkpoint=...)` at the end of your "
            "training loop to get this behavior."
        )
    if config.checkpoint_frequency:
        raise ValueError(
            "'checkpoint_frequency' cannot be set for a function trainable. You will need to "
            "report a checkpoint every `checkpoint_frequency` iterations within your training "
            "loop using `tune.report(metrics=..., checkpoint=...)` to get this behavior."
        )


def _check_stop(stop: Any) -> None:
    if stop is None or (callable(stop) and not isinstance(stop, Mapping)):
        return
    if not isinstance(stop, Mapping):
        raise TypeError(
            f"`stop` must be a dict, a callable (trial_id, result) -> bool, or None; got {stop!r}"
        )
    for key, bound in stop.items():
        if not isinstance(key, str):
            raise TypeError(f"`stop` key {key!r} must be a string (a result key)")
        if not isinstance(bound, numbers.Real):  # True counts: Ray's {"done": True}
            raise TypeError(
                f"`stop[{key!r}]` is {bound!r} ({type(bound).__name__}), but must be a number "
                "(a trial stops once result[key] >= it)"
            )
        if math.isnan(bound):  # no result is >= NaN: the trial would never stop by it
            raise ValueError(
                f"`stop[{key!r}]` is {bound!r}, but must be a number, not NaN (a trial stops "
                "once result[key] >= it; infinity: never by this key)"
            )


def _check_keys(value: Any, where: str) -> None:
    """Every dict in ``value`` (a config, nested dicts, lists and ``choice`` categories
    included) has string keys: ``params.json`` and the commits keep JSON object keys,
    so a resumed trial would see ``{1: 2}`` come back as ``{"1": 2}``."""
    if isinstance(value, Mapping):
        for key, sub in value.items():
            if not isinstance(key, str):
                raise TypeError(
                    f"`{where}` has the key {key!r} ({type(key).__name__}), but every key in "
                    "`param_space` must be a string (params.json and a resume keep string "
                    "keys only)"
                )
            _check_keys(sub, f"{where}[{key!r}]")
    elif isinstance(value, list | tuple):
        for i, sub in enumerate(value):
            _check_keys(sub, f"{where}[{i}]")
    elif isinstance(value, Categorical):
        for i, sub in enumerate(value.categories):
            _check_keys(sub, f"{where}.categories[{i}]")


def _check_arguments(
    trainable: Any,
    param_space: Any,
    scheduler: Any,
    num_samples: Any,
    metric: Any,
    mode: Any,
    stop: Any,
    checkpoint_config: Any,
    name: Any,
    seed: Any,
    max_failures: Any,
    dask_address: Any,
    n_workers: Any,
    commit_interval: Any,
    log_flush_interval: Any,
    resume: Any,
    lease_ttl: Any,
    segment_timeout_s: Any,
) -> None:
    """Every argument's type and range, before anything starts or is written."""
    _check_trainable(trainable)
    if param_space is not None and not isinstance(param_space, Mapping):
        raise TypeError(
            f"`param_space` is {param_space!r} ({type(param_space).__name__}), but must be a "
            "dict of hyperparameter names to values or search spaces"
        )
    _check_keys(param_space, "param_space")
    if not isinstance(scheduler, TrialScheduler):
        raise TypeError(f"`scheduler` must be a popflow.TrialScheduler, got {scheduler!r}")
    if not is_int(num_samples) or num_samples < 1:
        raise ValueError(f"`num_samples` is {num_samples!r}, but must be an int >= 1")
    if metric is not None and not isinstance(metric, str):
        raise TypeError(f"`metric` is {metric!r}, but must be a result key (a string) or None")
    if mode is not None and mode not in ("min", "max"):
        raise ValueError(f"`mode` is {mode!r}, but must be 'min' or 'max'")
    _check_stop(stop)
    if checkpoint_config is not None and not isinstance(checkpoint_config, CheckpointConfig):
        raise TypeError(
            f"`checkpoint_config` is {checkpoint_config!r}, but must be a popflow.CheckpointConfig"
        )
    if name is not None:
        check_name(name)
    if seed is not None and (not is_int(seed) or seed < 0):
        raise TypeError(f"`seed` is {seed!r}, but must be an int >= 0 or None")
    if not is_int(max_failures) or max_failures < -1:
        raise ValueError(
            f"`max_failures` is {max_failures!r}, but must be an int >= -1 (-1: retry forever)"
        )
    if dask_address is not None and not isinstance(dask_address, str | Client):
        raise TypeError(
            f"`dask_address` is {dask_address!r}, but must be a scheduler address such as "
            "'tcp://host:8786', a distributed.Client, or None"
        )
    if n_workers is not None and (not is_int(n_workers) or n_workers < 1):
        raise TypeError(f"`n_workers` is {n_workers!r}, but must be an int >= 1 or None")
    # a round every `commit_interval` s: infinity would commit nothing until the end
    check_real("commit_interval", commit_interval, low=0, strict=True, finite=True)
    check_real("log_flush_interval", log_flush_interval, low=0, strict=False)
    if not (isinstance(resume, bool) or resume == "auto"):
        raise ValueError(f"`resume` is {resume!r}, but must be False, True or 'auto'")
    check_real("lease_ttl", lease_ttl, low=0, strict=True, finite=True)
    check_real("segment_timeout_s", segment_timeout_s, low=0, strict=True, optional=True)


def _check_reachable(storage: Storage, name: str) -> None:
    """On an object store, one listing of the experiment's log folder, the last check:
    a missing bucket, credentials or endpoint fail here, as a StorageError naming what
    is wrong, rather than after the cluster and the Prefect flow run started (a local
    folder is made as needed)."""
    if not storage.is_local:
        storage.child(name).listdir(LOG_DIR)


def run_spec(
    trainable: Any,
    param_space: dict[str, Any] | None,
    *,
    scheduler: TrialScheduler | None,
    num_samples: int,
    metric: str | None,
    mode: str | None,
    stop: StopCondition,
    checkpoint_config: CheckpointConfig | None,
    storage: Storage,
    name: str | None,
    seed: int | None,
    max_failures: int,
    resources_per_trial: dict[str, float] | None,
    dask_address: str | Client | None,
    n_workers: int | None,
    commit_interval: float,
    log_flush_interval: float,
    resume: bool | str,
    lease_ttl: float,
    segment_timeout_s: float | None = None,
    fail_fast: bool | str = False,
    time_budget_s: float | None = None,
    max_rounds: int | None = None,
    max_concurrent_trials: int | None = None,
    callbacks: Any = None,
    trial_name_creator: Callable[[Any], str] | None = None,
    trial_dirname_creator: Callable[[Any], str] | None = None,
    errored: str = "skip",
    verbose: int | None = None,
) -> RunSpec:
    """Check ``popflow.run``'s arguments (and that an object store's bucket is there);
    the spec they describe."""
    scheduler = scheduler if scheduler is not None else FIFOScheduler()
    _check_arguments(
        trainable,
        param_space,
        scheduler,
        num_samples,
        metric,
        mode,
        stop,
        checkpoint_config,
        name,
        seed,
        max_failures,
        dask_address,
        n_workers,
        commit_interval,
        log_flush_interval,
        resume,
        lease_ttl,
        segment_timeout_s,
    )
    if resources_per_trial is not None:
        check_resources("resources_per_trial", resources_per_trial)
    if not (isinstance(fail_fast, bool) or fail_fast == "raise"):
        raise ValueError(f"`fail_fast` is {fail_fast!r}, but must be False, True or 'raise'")
    check_real("time_budget_s", time_budget_s, low=0, strict=True, optional=True)
    if max_rounds is not None and (not is_int(max_rounds) or max_rounds < 1):
        raise ValueError(f"`max_rounds` is {max_rounds!r}, but must be an int >= 1 or None")
    if max_concurrent_trials is not None and (
        not is_int(max_concurrent_trials) or max_concurrent_trials < 0
    ):
        raise ValueError(
            f"`max_concurrent_trials` is {max_concurrent_trials!r}, but must be an int >= 1 "
            "(0 or None: no limit)"
        )
    for argument, creator in (
        ("trial_name_creator", trial_name_creator),
        ("trial_dirname_creator", trial_dirname_creator),
    ):
        if creator is not None and not callable(creator):
            raise TypeError(f"`{argument}` is {creator!r}, but must be a function of the trial")
    if checkpoint_config is not None and is_function_trainable(trainable):
        _check_function_checkpoints(checkpoint_config)
    if errored not in ("skip", "resume", "restart"):
        raise ValueError(f"`errored` is {errored!r}, but must be 'skip', 'resume' or 'restart'")
    check_verbose(verbose)
    resources = dask_resources(resources_per_trial)
    if not scheduler.set_search_properties(metric, mode):
        raise ValueError(
            "`metric`/`mode` were passed to run() but the scheduler already has its own; "
            "set them in one place only"
        )
    name = (
        expand_name(name)
        if name
        else f"{trainable_name(trainable)}_{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    )
    check_name(name)  # a made-up name too: it holds the trainable's name
    check_experiment_path(storage, name)
    _check_reachable(storage, name)
    return RunSpec(
        trainable=trainable,
        param_space=dict(param_space or {}),
        scheduler=scheduler,
        num_samples=num_samples,
        stop=stop,
        checkpoint_config=checkpoint_config or CheckpointConfig(),
        storage=storage,
        name=name,
        seed=seed,
        max_failures=max_failures,
        resources_per_trial=resources_per_trial,
        resources=resources,
        dask_address=dask_address,
        n_workers=n_workers,
        commit_interval=commit_interval,
        log_flush_interval=log_flush_interval,
        resume=resume,
        lease_ttl=lease_ttl,
        segment_timeout_s=segment_timeout_s,
        fail_fast=fail_fast,
        time_budget_s=time_budget_s,
        max_rounds=max_rounds,
        max_concurrent_trials=max_concurrent_trials or None,
        callbacks=check_callbacks(callbacks),
        trial_name_creator=trial_name_creator,
        trial_dirname_creator=trial_dirname_creator,
        errored=errored,
        verbose=verbose,
    )
