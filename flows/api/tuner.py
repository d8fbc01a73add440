"""Ray Tune's ``Tuner`` front door over :func:`popflow.run`: ``TuneConfig``, ``RunConfig``,
``FailureConfig``, ``Tuner.fit``/``restore``/``can_restore``, and ``popflow.init``.

Field names and defaults are Ray Tune's (2.x). What Ray accepts and popflow
does not do yet raises at once, naming the argument (:class:`Unsupported`):
never ignored in silence. popflow's own extras are keyword fields at the
end (``TuneConfig.seed``, ``RunConfig.storage_options``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from popflow.flows.api.launch import run
from popflow.flows.experiment.results import ResultGrid
from popflow.flows.spec.config import CheckpointConfig, check_verbose
from popflow.flows.spec.run_args import load_run_args
from popflow.infra.cluster.dask_cluster import use_cores
from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import ExperimentLog
from popflow.schedulers import TrialScheduler

logger = logging.getLogger(__name__)

#: Where results go when ``RunConfig.storage_path`` is None (Ray: ``~/ray_results``).
DEFAULT_STORAGE = "./results"


class Unsupported(ValueError):
    """A Ray Tune argument popflow cannot honour (yet)."""

    def __init__(self, argument: str, value: Any, what_to_do: str) -> None:
        super().__init__(f"popflow does not support `{argument}={value!r}`: {what_to_do}")
        self.argument = argument


def _refuse(argument: str, value: Any, default: Any, what_to_do: str) -> None:
    if value != default:
        raise Unsupported(argument, value, what_to_do)


@dataclass(frozen=True)
class FailureConfig:
    """Ray's ``FailureConfig``: ``max_failures`` retries per trial (-1: forever)."""

    max_failures: int = 0
    fail_fast: bool | str = False  # True: end at the first trial error; "raise": raise it too


@dataclass(frozen=True)
class TuneConfig:
    """Ray's ``TuneConfig``; ``seed`` (popflow) makes the run repeat exactly."""

    mode: str | None = None
    metric: str | None = None
    search_alg: Any = None
    scheduler: TrialScheduler | None = None
    num_samples: int = 1
    max_concurrent_trials: int | None = None
    time_budget_s: float | None = None
    # popflow keeps trainables live between segments when it can (``reset_config``)
    reuse_actors: bool = False
    trial_name_creator: Callable[..., str] | None = None
    trial_dirname_creator: Callable[..., str] | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        _refuse(
            "search_alg",
            self.search_alg,
            None,
            "popflow samples `param_space` itself (random and grid search); drop it",
        )
        if not isinstance(self.reuse_actors, bool):
            raise TypeError(f"`reuse_actors` must be a bool, got {self.reuse_actors!r}")


@dataclass(frozen=True)
class RunConfig:
    """Ray's ``RunConfig``; results go to ``<storage_path>/<name>/`` (a folder or an fsspec
    URL such as ``s3://bucket/prefix``, with ``storage_options`` for fsspec)."""

    name: str | None = None
    storage_path: str | None = None
    storage_filesystem: Any = None
    failure_config: FailureConfig | None = None
    checkpoint_config: CheckpointConfig | None = None
    sync_config: Any = None
    verbose: int | None = None
    stop: Mapping[str, Any] | Callable[[str, dict[str, Any]], bool] | None = None
    callbacks: list[Any] | None = None
    progress_reporter: Any = None
    log_to_file: bool | str | tuple[str, str] = False
    local_dir: str | None = None
    storage_options: dict[str, Any] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        _refuse(
            "storage_filesystem",
            self.storage_filesystem,
            None,
            "pass an fsspec URL as `storage_path` and its options as `storage_options`",
        )
        _refuse("sync_config", self.sync_config, None, "storage is written directly; drop it")
        _refuse("local_dir", self.local_dir, None, "use `storage_path`")
        _refuse(
            "progress_reporter",
            self.progress_reporter,
            None,
            "popflow draws its own trial table; `verbose` (0-3) sets how much it shows",
        )
        _refuse(
            "log_to_file",
            self.log_to_file,
            False,
            "trial output goes to its Dask worker's log (the embedded cluster's: this "
            "console); write files into the trial's folder from the trainable instead",
        )
        check_verbose(self.verbose)
        if self.checkpoint_config is not None and not isinstance(
            self.checkpoint_config, CheckpointConfig
        ):
            raise TypeError(
                "`checkpoint_config` must be a popflow.tune.CheckpointConfig, got "
                f"{type(self.checkpoint_config).__name__}"
            )


@dataclass
class _Cluster:
    """What :func:`init` chose for the runs that follow."""

    address: Any = None


_CLUSTER = _Cluster()


def init(
    address: Any = None,
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    **ignored: Any,
) -> None:
    """Ray's ``ray.init``: ``address`` names a Dask scheduler (or Client) for the runs that
    follow; otherwise ``num_cpus`` is the CPUs the embedded cluster cuts into
    single-threaded process workers (one per CPU, or fewer and bigger when a trial
    needs more than one) and ``num_gpus`` the GPUs they share out (default: the
    machine's). Ray's other arguments are accepted and logged."""
    if address is not None and num_cpus is not None:
        raise ValueError("give `address` (an existing cluster) or `num_cpus`, not both")
    if num_cpus is not None and (
        isinstance(num_cpus, bool) or not isinstance(num_cpus, int) or num_cpus < 1
    ):
        raise ValueError(f"`num_cpus` is {num_cpus!r}, but must be an int >= 1")
    if num_gpus is not None and (
        isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 0
    ):
        raise ValueError(f"`num_gpus` is {num_gpus!r}, but must be an int >= 0")
    if ignored:
        logger.info("popflow.init: ignoring %s (Ray-only)", sorted(ignored))
    _CLUSTER.address = address
    use_cores(num_cpus, num_gpus)


def cluster_arguments() -> dict[str, Any]:
    """``dask_address`` for :func:`popflow.run`, as :func:`init` set it (its ``num_cpus``
    went to :func:`popflow.infra.cluster.dask_cluster.use_cores`)."""
    return {"dask_address": _CLUSTER.address}


class Tuner:
    """Ray's ``Tuner``: ``Tuner(trainable, param_space=..., tune_config=..., run_config=...).fit()``."""

    def __init__(
        self,
        trainable: Any = None,
        *,
        param_space: dict[str, Any] | None = None,
        tune_config: TuneConfig | None = None,
        run_config: RunConfig | None = None,
    ) -> None:
        if trainable is None:
            raise TypeError("Tuner needs a trainable (a Trainable subclass or a function)")
        for argument, value, kind in (
            ("tune_config", tune_config, TuneConfig),
            ("run_config", run_config, RunConfig),
        ):
            if value is not None and not isinstance(value, kind):
                raise TypeError(
                    f"`{argument}` must be a popflow.tune.{kind.__name__}, got {type(value).__name__}"
                )
        self.trainable = trainable
        self.param_space = param_space
        self.tune_config = tune_config or TuneConfig()
        self.run_config = run_config or RunConfig()
        self._restore: dict[str, Any] | None = None  # run()'s arguments, after restore()
        self._resume: dict[str, Any] = {}  # tune.run(resume=...): run()'s resume, errored

    def fit(self) -> ResultGrid:
        """Run the experiment (or continue it, after :meth:`restore`); its results."""
        tc, rc = self.tune_config, self.run_config
        failure = rc.failure_config or FailureConfig()
        if self._restore is not None:
            cluster = cluster_arguments()  # popflow.init's, else the run's own scheduler
            if cluster["dask_address"] is None:
                cluster["dask_address"] = self._restore.get("dask_address")
            return run(**{**self._restore, **cluster}, verbose=rc.verbose)
        return run(
            self.trainable,
            self.param_space,
            scheduler=tc.scheduler,
            num_samples=tc.num_samples,
            metric=tc.metric,
            mode=tc.mode,
            stop=rc.stop,
            checkpoint_config=rc.checkpoint_config,
            storage=rc.storage_path or DEFAULT_STORAGE,
            storage_options=rc.storage_options,
            name=rc.name,
            seed=tc.seed,
            max_failures=failure.max_failures,
            fail_fast=failure.fail_fast,
            **self._resume,
            time_budget_s=tc.time_budget_s,
            max_concurrent_trials=tc.max_concurrent_trials,
            callbacks=rc.callbacks,
            verbose=rc.verbose,
            trial_name_creator=tc.trial_name_creator,
            trial_dirname_creator=tc.trial_dirname_creator,
            **cluster_arguments(),
        )

    def fit_resuming(self, errored: str = "skip") -> ResultGrid:
        """:meth:`fit`, continuing the experiment if it exists (Ray's ``tune.run(resume=...)``;
        ``errored``: what its errored trials do, as ``run``'s)."""
        self._resume = {"resume": "auto", "errored": errored}
        return self.fit()

    @classmethod
    def restore(
        cls,
        path: str,
        trainable: Any,
        resume_unfinished: bool = True,
        resume_errored: bool = False,
        restart_errored: bool = False,
        param_space: dict[str, Any] | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> Tuner:
        """A Tuner that continues the experiment at ``path`` (``<storage_path>/<name>``)
        from its last commit, with the arguments it was started with."""
        _refuse("resume_unfinished", resume_unfinished, True, "leave it True")
        storage = Storage(path, storage_options)
        if ExperimentLog(storage).latest() is None:
            raise ValueError(f"nothing to restore: no committed experiment at {storage.url}")
        parent, name = storage.url.rstrip("/").rsplit("/", 1)
        tuner = cls(trainable, param_space=param_space)
        saved = load_run_args(storage)  # the scheduler, stop, seed, ... it started with
        tuner._restore = {
            **saved,
            "trainable": trainable,
            "param_space": param_space if param_space is not None else saved["param_space"],
            "storage": parent,
            "storage_options": storage_options,
            "name": name,
            "resume": True,
            # Ray: resume_errored wins when both are set
            "errored": "resume" if resume_errored else "restart" if restart_errored else "skip",
        }
        return tuner

    @classmethod
    def can_restore(cls, path: str, storage_options: dict[str, Any] | None = None) -> bool:
        """Whether ``path`` holds a committed experiment to restore."""
        return ExperimentLog(Storage(path, storage_options)).latest() is not None
