"""``popflow.run``: check the arguments, start the cluster, run the ``tune`` flow.

Ray Tune's legacy ``tune.run`` and ``Tuner.fit`` in one call. The arguments
are checked in their groups (Ray's ``TuneConfig``/``RunConfig``, popflow's storage,
cluster, budget and resume) and put into a :class:`~popflow.flows.spec.run_spec.RunSpec`,
once, before the cluster starts. The training (:mod:`popflow.flows.api.training`) then
runs in the calling thread at once, while a thread of its own imports Prefect and
records the run as the ``tune`` flow run (:mod:`popflow.flows.record.prefect_flow`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
import sysconfig
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import cloudpickle
from distributed import Client

from popflow.flows.api.training import train
from popflow.flows.experiment.results import ResultGrid
from popflow.flows.record.flow_parameters import Shown, cluster_view, spec_view
from popflow.flows.record.flow_retries import is_flow_retry, refuse_crash_loop
from popflow.flows.record.prefect_flow import PrefectRecord
from popflow.flows.spec.config import CheckpointConfig, grows
from popflow.flows.spec.groups import BudgetSpec, ClusterSpec, ResumeSpec, StorageSpec
from popflow.flows.spec.ray_configs import FailureConfig, RunConfig, TuneConfig
from popflow.flows.spec.run_spec import RunSpec, run_spec
from popflow.infra.cluster.dask_cluster import ClusterStart
from popflow.infra.fast_exit import skip_teardown_collections
from popflow.infra.storage.folder import Storage
from popflow.infra.store.lease import LEASE_ERRORS
from popflow.schedulers import TrialScheduler
from popflow.schedulers.search import Searcher
from popflow.tasks.parameters import parameters_of
from popflow.tasks.trainable import Trainable


def run(
    trainable: type[Trainable] | Callable[[dict[str, Any]], Any],
    param_space: dict[str, Any] | None = None,
    *,
    scheduler: TrialScheduler | None = None,
    search_alg: Searcher | None = None,
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
    segment_timeout_s: float | None = None,
    fail_fast: bool | str = False,
    time_budget_s: float | None = None,
    max_rounds: int | None = None,
    run_budget_s: float | None = None,
    max_concurrent_trials: int | None = None,
    callbacks: list[Any] | None = None,
    log_to_file: bool | str | tuple[str, str] = False,
    trial_name_creator: Callable[[Any], str] | None = None,
    trial_dirname_creator: Callable[[Any], str] | None = None,
    errored: str = "skip",
    verbose: int | None = None,
    resume_unfinished: bool = True,
) -> ResultGrid:
    """Tune ``trainable`` over ``param_space`` with ``scheduler``; Ray Tune's ``Tuner.fit``.

    - ``trainable``: a :class:`popflow.tasks.Trainable` subclass or a function using
      :func:`popflow.tasks.report`.
    - ``param_space``: plain values and search spaces (``uniform``, ``choice``,
      ``grid_search``...); each grid point is sampled ``num_samples`` times.
    - ``search_alg``: Ray's ``Searcher`` (``OptunaSearch``, ``ConcurrencyLimiter``...):
      it suggests each new trial's config, up to ``num_samples`` trials, and learns from
      their results; its calls are committed, so a resume continues its model
      (:mod:`popflow.flows.driver.suggestions`). None: random and grid search.
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
    - ``lease_ttl``: seconds a stalled driver's lease blocks another driver (a
      dead one on the same host is taken over at once).
    - ``segment_timeout_s``: a segment running longer errors its trial (as
      any failure: ``max_failures`` retries apply) and restarts its worker
      process; None waits for ever (a segment running far longer than its
      peers is warned about).
    - ``fail_fast``: True ends the experiment at the first trial error (after
      its ``max_failures`` retries; the trials still running are stopped and
      the run is finished); "raise" then raises :class:`TrialError`.
    - ``time_budget_s``: Ray's: end the experiment after so many seconds (segments in
      flight end at their next report, which is kept; every trial still live ends
      TERMINATED; a restore then runs nothing more).
    - ``run_budget_s``: popflow's: end this *run* after so many seconds of rounds:
      segments in flight are cancelled, everything is committed, and the experiment
      stays unfinished, so ``resume="auto"`` (or ``Tuner.restore``, which keeps this
      budget) goes on from there. (Before popflow had Ray's ``time_budget_s``, this was
      its meaning.)
    - ``max_rounds``: the same after so many rounds of this run (a scheduled
      deployment's run advancing the experiment a few rounds per trigger).
    - ``max_concurrent_trials``: at most so many trials started and not ended at
      once (Ray's); the others wait, unstarted.
    - ``callbacks``: Ray's ``tune.Callback`` objects, called on the driver
      (:mod:`popflow.flows.events.callbacks`).
    - ``log_to_file``: Ray's: each trial's stdout and stderr also go to files in its
      folder (True: ``stdout``/``stderr``; a name: one file; a pair: two), appended
      across segments and resumes (:mod:`popflow.tasks.trial_output`).
    - ``trial_name_creator``/``trial_dirname_creator``: Ray's: a function of the
      trial returning its name (``str(trial)``) or its folder's name.
    - ``errored``: when resuming, what errored trials do: "skip" (stay errored),
      "resume" (from their last checkpoint) or "restart" (from scratch).
    - ``resume_unfinished``: when resuming, False ends the unfinished trials (TERMINATED,
      as they were) instead of going on with them (Ray's ``Tuner.restore`` option).
    - ``verbose``: Ray's 0-3: what the console shows (0 warnings only, 1 a status
      line, 2 the trial table, 3 also each result and decision; default 2);
      :mod:`popflow.flows.console.verbose`.
    - ``log_flush_interval``: on object stores, seconds between rewrites of
      result.json / progress.csv / pbt_global.txt (each commit holds its own
      results, so nothing is lost in between); local files are appended at once.
    """
    return run_grouped(
        trainable,
        param_space,
        TuneConfig(
            mode=mode,
            metric=metric,
            scheduler=scheduler,
            search_alg=search_alg,
            num_samples=num_samples,
            max_concurrent_trials=max_concurrent_trials,
            time_budget_s=time_budget_s,
            trial_name_creator=trial_name_creator,
            trial_dirname_creator=trial_dirname_creator,
            seed=seed,
        ),
        RunConfig(
            name=name,
            failure_config=FailureConfig(max_failures=max_failures, fail_fast=fail_fast),
            checkpoint_config=checkpoint_config,
            verbose=verbose,
            stop=stop,
            callbacks=callbacks,
            log_to_file=log_to_file,
        ),
        StorageSpec(
            Storage(storage, storage_options),
            commit_interval=commit_interval,
            log_flush_interval=log_flush_interval,
            lease_ttl=lease_ttl,
        ),
        ClusterSpec(dask_address, n_workers, resources_per_trial),
        BudgetSpec(
            max_rounds=max_rounds, segment_timeout_s=segment_timeout_s, run_budget_s=run_budget_s
        ),
        ResumeSpec(resume, errored, resume_unfinished),
    )


def run_grouped(
    trainable: type[Trainable] | Callable[[dict[str, Any]], Any],
    param_space: dict[str, Any] | None,
    tune_config: TuneConfig,
    run_config: RunConfig,
    storage: StorageSpec,
    cluster: ClusterSpec | None = None,
    budget: BudgetSpec | None = None,
    resuming: ResumeSpec | None = None,
) -> ResultGrid:
    """:func:`run` with its arguments in their groups, each checked when made (``Tuner.fit``
    passes Ray's ``TuneConfig`` and ``RunConfig`` as given): the spec is built once, then
    the cluster, the Prefect record and the training start."""
    refuse_crash_loop()
    resuming = resuming or ResumeSpec()
    if not resuming.resume and is_flow_retry():  # a retried flow run that calls run()
        resuming = dataclasses.replace(resuming, resume="auto")  # picks up its work
    spec = run_spec(
        trainable, param_space, tune_config, run_config, storage, cluster, budget, resuming
    )
    params = parameters_of(spec.trainable)
    if params is not None:  # with_parameters: its objects, once, before any segment is pickled
        params.store(spec.experiment_storage)
    _ship_by_value(spec.trainable, remote=spec.dask_address is not None)
    skip_teardown_collections()  # the script exits without the teardown's collections
    # the training starts at once; Prefect records it from a thread of its own
    workers = spec.dask_address or ClusterStart(
        spec.n_workers, spec.resources, grows(spec.scheduler)
    )
    record = PrefectRecord(spec, _shown(spec, workers))
    record.start()
    try:
        return train(spec, workers, spec.resume, record.feed).grid
    except LEASE_ERRORS as e:  # no bug to trace: its one line says what to do
        raise e.with_traceback(None) from None
    finally:
        # the embedded cluster closes while the record catches up
        closing = _closing(workers) if isinstance(workers, ClusterStart) else None
        record.finish()
        if closing is not None:
            closing.result()


def _closing(cluster: ClusterStart) -> Future[None]:
    """``cluster.close()`` in a thread of its own; its future."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="popflow-cluster-close")
    try:
        return pool.submit(cluster.close)
    finally:
        pool.shutdown(wait=False)


def _shown(spec: RunSpec, cluster: Any) -> tuple[Shown[RunSpec], Shown[Any]]:
    """The ``tune`` flow's arguments, readable in the Prefect UI as its parameters."""
    return Shown(spec, spec_view(spec)), Shown(cluster, cluster_view(cluster, spec.n_workers))


def _ship_by_value(trainable: Any, remote: bool = False) -> None:
    """Let workers unpickle a trainable whose module they cannot import by name.

    A module loaded from a file path (a Prefect deployment's entrypoint, a
    notebook cell) has no importable name, so cloudpickle must send its code.
    On a cluster of its own (``remote``) a worker may not have the user's code
    at all: a trainable from the user's own files (not an installed package)
    travels by value there too.
    """
    name = getattr(trainable, "__module__", None) or ""
    module = sys.modules.get(name)
    if module is None or name == "__main__":
        return  # __main__ already travels by value
    try:
        importable = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        importable = False
    if not importable or (remote and _is_users_own(module)):
        cloudpickle.register_pickle_by_value(module)


def _is_users_own(module: Any) -> bool:
    """A module from the user's files: not popflow, not from an installed package or the
    standard library (their workers have those)."""
    path = getattr(module, "__file__", None)
    if not path or module.__name__.split(".")[0] == "popflow":
        return False
    installed = {sysconfig.get_paths()[key] for key in ("purelib", "platlib", "stdlib")}
    path = os.path.realpath(path)
    return not any(path.startswith(os.path.realpath(p) + os.sep) for p in installed)
