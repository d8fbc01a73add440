"""Ray Tune's ``Tuner`` front door over :func:`popflow.run`: ``Tuner.fit``/``restore``/
``can_restore``, and ``popflow.init``.

``Tuner`` takes Ray's ``TuneConfig`` and ``RunConfig`` (with ``FailureConfig`` and
``CheckpointConfig``), which check themselves where they are made
(:mod:`popflow.flows.spec.ray_configs`), and hands them to the run as they are.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import fsspec

from popflow.flows.api.launch import run, run_grouped
from popflow.flows.experiment.results import ResultGrid, flatten
from popflow.flows.spec.groups import ClusterSpec, ResumeSpec, StorageSpec
from popflow.flows.spec.ray_configs import (
    FailureConfig,
    RunConfig,
    TuneConfig,
    Unsupported,
)
from popflow.flows.spec.run_args import load_run_args
from popflow.infra.cluster.dask_cluster import check_embedded_workers, check_gpus, use_cores
from popflow.infra.storage.credentials import StorageOptions
from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import ExperimentLog
from popflow.infra.store.layout import EXPERIMENT_FILE
from popflow.tasks.trainable import trainable_name

__all__ = [
    "FailureConfig",
    "RunConfig",
    "TuneConfig",
    "Tuner",
    "Unsupported",
    "cluster_arguments",
    "init",
]

logger = logging.getLogger(__name__)

#: Where results go when ``RunConfig.storage_path`` is None (Ray: ``~/ray_results``).
DEFAULT_STORAGE = "./results"


@dataclass
class _Cluster:
    """What :func:`init` chose for the runs that follow."""

    address: Any = None
    initialized: bool = False  # ray.is_initialized(): init() ran, no shutdown() since


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
    if num_cpus is not None:  # one embedded worker process per CPU
        check_embedded_workers("num_cpus", num_cpus)
    if num_gpus is not None:
        check_gpus("num_gpus", num_gpus)
    if ignored:
        logger.info("popflow.init: ignoring %s (Ray-only)", sorted(ignored))
    _CLUSTER.address = address
    _CLUSTER.initialized = True
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
        self._restore_options: StorageOptions | None = None  # and its storage_options
        self._resume = ResumeSpec()  # tune.run(resume=...): continue, and what errored trials do
        self._results: ResultGrid | None = None  # the last fit's, for get_results()

    def fit(self) -> ResultGrid:
        """Run the experiment (or continue it, after :meth:`restore`); its results."""
        rc = self.run_config
        if self._restore is not None:
            cluster = cluster_arguments()  # popflow.init's, else the run's own scheduler
            if cluster["dask_address"] is None:
                cluster["dask_address"] = self._restore.get("dask_address")
            options = plain(self._restore_options)
            self._results = run(
                **{**self._restore, **cluster}, storage_options=options, verbose=rc.verbose
            )
            return self._results
        self._results = run_grouped(
            self.trainable,
            self.param_space,
            self.tune_config,
            rc,
            StorageSpec(Storage(rc.storage_path or DEFAULT_STORAGE, plain(rc.storage_options))),
            ClusterSpec(**cluster_arguments()),
            resuming=self._resume,
        )
        return self._results

    def get_results(self) -> ResultGrid:
        """Ray's ``Tuner.get_results``: what :meth:`fit` returned, or, for a Tuner from
        :meth:`restore` not fit yet, the experiment's results as its last commit has them
        (read from storage: its unfinished trials as they were left).

        >>> Tuner.restore("./results/exp", trainable=train).get_results()  # doctest: +SKIP
        """
        if self._results is not None:
            return self._results
        if self._restore is not None:
            path = f"{self._restore['storage'].rstrip('/')}/{self._restore['name']}"
            return ResultGrid.from_path(path, plain(self._restore_options))
        raise RuntimeError(  # Ray's words
            "Can't return results as experiment has not been run, yet. "
            "Call `Tuner.fit()` to run the experiment first."
        )

    def fit_resuming(self, errored: str = "skip") -> ResultGrid:
        """:meth:`fit`, continuing the experiment if it exists (Ray's ``tune.run(resume=...)``;
        ``errored``: what its errored trials do, as ``run``'s)."""
        self._resume = ResumeSpec("auto", errored)
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
        storage_filesystem: Any = None,
        storage_options: dict[str, Any] | None = None,
    ) -> Tuner:
        """A Tuner that continues the experiment at ``path`` (``<storage_path>/<name>``)
        from its last commit, with the arguments it was started with (Ray's options):

        - ``trainable``: the one the experiment was started with (its name is checked).
        - ``resume_unfinished``: True goes on with the unfinished trials; False ends them
          as they are, TERMINATED (even one never trained).
        - ``resume_errored``: errored trials go on from their last checkpoints;
          ``restart_errored``: they start again from scratch (``resume_errored`` wins).
        - ``param_space``: the same space again (its keys are checked), only to hand
          over objects anew; None: the one kept with the experiment.
        - ``storage_filesystem``: an fsspec filesystem for ``path`` (Ray's takes a pyarrow
          one); its options are used as ``storage_options``.
        - ``storage_options``: fsspec's options for ``path`` (popflow's).
        """
        for flag, value in (
            ("resume_unfinished", resume_unfinished),
            ("resume_errored", resume_errored),
            ("restart_errored", restart_errored),
        ):
            if not isinstance(value, bool):
                raise TypeError(f"`{flag}` is {value!r}, but must be a bool")
        path, storage_options = _with_filesystem(path, storage_filesystem, storage_options)
        storage = Storage(path, storage_options)
        if ExperimentLog(storage).latest() is None:
            raise ValueError(f"nothing to restore: no committed experiment at {storage.url}")
        _check_trainable(storage, trainable)
        parent, name = storage.url.rstrip("/").rsplit("/", 1)
        tuner = cls(trainable, param_space=param_space)
        saved = load_run_args(storage)  # the scheduler, stop, seed, ... it started with
        if param_space is not None:
            _check_param_space(param_space, saved["param_space"])
        tuner._restore = {
            **saved,
            "trainable": trainable,
            "param_space": param_space if param_space is not None else saved["param_space"],
            "storage": parent,
            "name": name,
            "resume": True,
            # Ray: resume_errored wins when both are set
            "errored": "resume" if resume_errored else "restart" if restart_errored else "skip",
            "resume_unfinished": resume_unfinished,
        }
        # credentials: kept where they never print nor pickle
        tuner._restore_options = StorageOptions(storage_options) if storage_options else None
        return tuner

    @classmethod
    def can_restore(
        cls,
        path: str,
        storage_filesystem: Any = None,
        storage_options: dict[str, Any] | None = None,
    ) -> bool:
        """Whether ``path`` holds a committed experiment to restore (``storage_filesystem``:
        an fsspec filesystem, as :meth:`restore` takes it)."""
        path, storage_options = _with_filesystem(path, storage_filesystem, storage_options)
        return ExperimentLog(Storage(path, storage_options)).latest() is not None


def _with_filesystem(
    path: str, filesystem: Any, options: dict[str, Any] | None
) -> tuple[str, dict[str, Any] | None]:
    """``path`` as a URL and its storage options, given Ray's ``storage_filesystem``."""
    if filesystem is None:
        return path, options
    if not isinstance(filesystem, fsspec.AbstractFileSystem):
        raise TypeError(
            f"`storage_filesystem` is {type(filesystem).__name__}, but popflow takes an fsspec "
            "filesystem (Ray takes pyarrow's); or pass a URL as `path` and `storage_options`"
        )
    if options is not None:
        raise ValueError("give `storage_filesystem` or `storage_options`, not both")
    url = path if "://" in path else filesystem.unstrip_protocol(path)
    return url, dict(filesystem.storage_options) or None


def _check_trainable(storage: Storage, trainable: Any) -> None:
    """Ray's check: the trainable restored with is the one the experiment started with
    (by name)."""
    started = json.loads(storage.read_text(EXPERIMENT_FILE)).get("trainable")
    given = trainable_name(trainable)
    if started is not None and given != started:
        raise ValueError(  # Ray's words
            "Invalid `trainable` input to `Tuner.restore()`. To fix this error, pass in the "
            "same trainable that was used to initialize the Tuner. Got a trainable with "
            f"identifier '{given}' but expected '{started}'."
        )


def _check_param_space(given: Any, started: Any) -> None:
    """Ray's check: a re-specified ``param_space`` has the original's keys (nested dicts
    flattened); it is there to hand over objects anew, not to change the search."""
    if not isinstance(given, Mapping):
        raise TypeError(f"`param_space` must be a dict, got {type(given).__name__}")
    keys = sorted(flatten(dict(given)))
    expected = sorted(flatten(dict(started or {})))
    if keys != expected:
        raise ValueError(  # Ray's words
            "Invalid `param_space` input to `Tuner.restore()`. To fix this error, pass in "
            "the same `param_space` that was used to initialize the Tuner. Only re-specify "
            "the `param_space` to refresh Ray object references that no longer exist due "
            "to restoring from a new Ray cluster session. It should not be used to introduce "
            f"new hyperparameters to tune.\n\nGot: {keys}\nExpected: {expected}"
        )


def plain(options: StorageOptions | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``options`` as the dict ``Storage`` and ``run`` take (credentials included)."""
    return StorageOptions(options).value if options is not None else None
