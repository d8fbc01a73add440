"""A run's arguments, checked once: :func:`run_spec` turns ``popflow.run``'s keyword
arguments into a frozen :class:`RunSpec` before Prefect or the cluster starts.

Every later layer takes the spec, so no signature is repeated and no argument
is checked twice; a bad argument fails with a message naming it and its value
before anything is written.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from distributed import Client

from popflow.flows.config import CheckpointConfig
from popflow.infra.cluster import dask_resources
from popflow.infra.storage import Storage
from popflow.schedulers import FIFOScheduler, TrialScheduler
from popflow.tasks.specs import StopCondition
from popflow.tasks.trainable import Trainable, is_function_trainable

RESUME_VALUES = (False, True, "auto")


def trainable_name(trainable: Any) -> str:
    return getattr(trainable, "__name__", type(trainable).__name__)


@dataclass(frozen=True)
class RunSpec:
    """What one experiment runs, as validated from ``popflow.run``'s arguments.

    ``storage`` is the root (credentials hidden, see
    :mod:`popflow.infra.credentials`); the experiment lives at
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
) -> RunSpec:
    """Check ``popflow.run``'s arguments; the spec they describe."""
    _check_trainable(trainable)
    scheduler = scheduler if scheduler is not None else FIFOScheduler()
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
    if resume not in RESUME_VALUES:
        raise ValueError(f"`resume` is {resume!r}, but must be False, True or 'auto'")
    if lease_ttl <= 0:
        raise ValueError(f"`lease_ttl` is {lease_ttl}, but must be > 0")
    if n_workers is not None and n_workers < 1:
        raise ValueError(f"`n_workers` is {n_workers}, but must be >= 1")
    resources = dask_resources(resources_per_trial)
    if not scheduler.set_search_properties(metric, mode):
        raise ValueError(
            "`metric`/`mode` were passed to run() but the scheduler already has its own; "
            "set them in one place only"
        )
    return RunSpec(
        trainable=trainable,
        param_space=dict(param_space or {}),
        scheduler=scheduler,
        num_samples=num_samples,
        stop=stop,
        checkpoint_config=checkpoint_config or CheckpointConfig(),
        storage=storage,
        name=name or f"{trainable_name(trainable)}_{time.strftime('%Y-%m-%d_%H-%M-%S')}",
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
    )
