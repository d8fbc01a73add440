"""A run's arguments, checked once, in one home: :func:`run_spec` puts their groups
(Ray's :class:`~popflow.flows.spec.ray_configs.TuneConfig` and
:class:`~popflow.flows.spec.ray_configs.RunConfig`, popflow's
:mod:`~popflow.flows.spec.groups`) into a frozen :class:`RunSpec` before Prefect or the
cluster starts.

Each group checks its own fields when it is made; what only the whole run can
check (the trainable with its checkpoint settings, metric and mode with the
scheduler, the experiment's name and path) is checked here. Every later layer
takes the spec, so no signature is repeated and no argument is checked twice; a bad
argument fails with a message naming it and its value before anything is written.
Adding an argument: a field in its group (with its check), and the public doors
that take it (``popflow.run``, and Ray's ``tune.run`` where Ray has it).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from popflow.flows.events.callbacks import check_callbacks
from popflow.flows.spec.config import CheckpointConfig, resources_of
from popflow.flows.spec.experiment_name import check_experiment_path, check_name, expand_name
from popflow.flows.spec.groups import BudgetSpec, ClusterSpec, ResumeSpec, StorageSpec
from popflow.flows.spec.ray_configs import FailureConfig, RunConfig, TuneConfig
from popflow.infra.storage.folder import Storage
from popflow.infra.store.layout import LOG_DIR, PARAMS
from popflow.schedulers import FIFOScheduler, TrialScheduler
from popflow.schedulers.domains import Categorical
from popflow.schedulers.search_space import has_search_spaces
from popflow.schedulers.variants import count_variants
from popflow.tasks.trainable import (
    Trainable,
    is_function_trainable,
    saves_checkpoints,
    trainable_name,
)

__all__ = ["RUN_ARGUMENTS", "RunSpec", "expand_name", "run_spec"]


class Flat:
    """A run argument read from its group under ``run``'s own name: ``spec.seed`` is
    ``spec.tune_config.seed``. ``stored``: kept in ``run_args.json`` for a resume."""

    def __init__(self, *path: str, stored: bool = True) -> None:
        self.path = path
        self.stored = stored
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.__doc__ = f"``{'.'.join((*self.path, name))}``"

    def __get__(self, spec: Any, owner: type | None = None) -> Any:
        if spec is None:
            return self
        group = spec
        for part in self.path:
            group = getattr(group, part)
        return getattr(group, self.name)


@dataclass(frozen=True)
class RunSpec:
    """What one experiment runs: the trainable, its space, and the run's checked groups.

    ``name`` is the experiment's (a template expanded, or made up); it lives at
    ``storage.child(name)``. ``tune_config`` has its scheduler (FIFO if none was
    given; ``metric``/``mode`` are the scheduler's); ``run_config`` has its
    ``failure_config`` and ``checkpoint_config`` and says nothing of where the
    experiment goes (``name``, ``storage_spec``: no credentials in it). Every
    argument of ``popflow.run`` reads under its own name (``spec.max_failures``).
    """

    trainable: type[Trainable] | Callable[[dict[str, Any]], Any]
    param_space: dict[str, Any]
    name: str
    tune_config: TuneConfig
    run_config: RunConfig
    storage_spec: StorageSpec
    cluster: ClusterSpec
    budget: BudgetSpec
    resuming: ResumeSpec

    #: the scheduler the run uses (FIFO if none was given), with metric and mode set
    scheduler = Flat("tune_config")
    #: Ray's ``Searcher`` (None: random and grid search over ``param_space``); kept in
    #: ``run_args.json`` only when given, so older experiments' files read the same
    search_alg = Flat("tune_config", stored=False)
    num_samples = Flat("tune_config")
    seed = Flat("tune_config")
    time_budget_s = Flat("tune_config")
    max_concurrent_trials = Flat("tune_config")
    trial_name_creator = Flat("tune_config", stored=False)
    trial_dirname_creator = Flat("tune_config", stored=False)
    stop = Flat("run_config")
    #: Ray's ``tune.Callback`` objects, called on the driver (never pickled into a commit)
    callbacks = Flat("run_config")
    #: Ray's ``verbose`` as given (None: the default); :mod:`popflow.flows.console.verbose`
    verbose = Flat("run_config", stored=False)
    checkpoint_config = Flat("run_config")
    #: Ray's ``log_to_file``; kept in ``run_args.json`` only when given (older files read
    #: the same), so a resume's trials go on writing their output files
    log_to_file = Flat("run_config", stored=False)
    max_failures = Flat("run_config", "failure_config")
    fail_fast = Flat("run_config", "failure_config")
    storage = Flat("storage_spec", stored=False)
    commit_interval = Flat("storage_spec")
    log_flush_interval = Flat("storage_spec")
    lease_ttl = Flat("storage_spec")
    dask_address = Flat("cluster")
    n_workers = Flat("cluster", stored=False)
    resources_per_trial = Flat("cluster")
    max_rounds = Flat("budget")
    segment_timeout_s = Flat("budget")
    #: popflow's budget of one run (the experiment stays resumable); kept in
    #: ``run_args.json`` only when given, so older experiments' files read the same
    run_budget_s = Flat("budget", stored=False)
    resume = Flat("resuming", stored=False)
    #: on resume, errored trials: "skip" (stay errored), "resume" (from their last
    #: checkpoint) or "restart" (from scratch); Ray's ``resume_errored``/``restart_errored``
    errored = Flat("resuming", stored=False)
    #: on resume, unfinished trials: True goes on with them, False ends them (Ray's
    #: ``resume_unfinished``)
    resume_unfinished = Flat("resuming", stored=False)

    @property
    def resources(self) -> dict[str, float] | None:
        """``resources_per_trial`` in Dask's names."""
        return self.cluster.resources

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
        """By default class trainables that implement ``save_checkpoint`` save at the end;
        one without it runs with no checkpoint, as in Ray; function trainables report theirs."""
        if self.checkpoint_config.checkpoint_at_end is not None:
            return self.checkpoint_config.checkpoint_at_end
        return not is_function_trainable(self.trainable) and saves_checkpoints(self.trainable)

    def run_args(self, seed: int) -> dict[str, Any]:
        """What ``popflow resume`` passes to ``run`` again (no storage, so no secrets).
        The run's own metric and mode are kept when given: the scheduler carries them,
        but a searcher is set up from the run's (kept only then: older files read the same)."""
        stored = {name: getattr(self, name) for name in STORED_ARGUMENTS}
        given = {k: getattr(self.tune_config, k) for k in ("metric", "mode")}
        return {
            "trainable": self.trainable,
            "param_space": self.param_space,
            **{k: v for k, v in given.items() if v is not None},
            **stored,
            "seed": seed,
            "callbacks": list(self.callbacks) or None,
            **({} if self.search_alg is None else {"search_alg": self.search_alg}),
            **({} if self.run_budget_s is None else {"run_budget_s": self.run_budget_s}),
            **({"log_to_file": self.log_to_file} if self.log_to_file else {}),
            # an address, not a Client: a Client's cluster may live only as long as its process
            "dask_address": self.dask_address if isinstance(self.dask_address, str) else None,
        }


_FLAT = {name: v for name, v in vars(RunSpec).items() if isinstance(v, Flat)}
#: The arguments ``run_args.json`` keeps, besides the trainable and its space.
STORED_ARGUMENTS = tuple(name for name, v in _FLAT.items() if v.stored)
#: ``popflow.run``'s keyword arguments (less ``storage_options``, which a spec never keeps).
RUN_ARGUMENTS = ("trainable", "param_space", "metric", "mode", "name", *_FLAT)


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


def _check_class_saves(
    trainable: Any, config: CheckpointConfig | None, scheduler: TrialScheduler
) -> None:
    """A class trainable without ``save_checkpoint`` is refused before anything starts
    where the run would ask it for a checkpoint (Ray errors each trial at its first save
    instead); anywhere else it runs, as in Ray."""
    if saves_checkpoints(trainable):
        return
    config = config or CheckpointConfig()
    if config.checkpoint_at_end:
        asks = "`checkpoint_at_end=True` asks for a checkpoint at each trial's end"
    elif config.checkpoint_frequency:
        asks = (
            f"`checkpoint_frequency={config.checkpoint_frequency}` asks for a checkpoint every "
            f"{config.checkpoint_frequency} iterations"
        )
    elif scheduler.needs_checkpoints:
        asks = (
            f"the scheduler {type(scheduler).__name__} pauses or clones trials, which "
            "restores them from their checkpoints"
        )
    else:
        return
    raise ValueError(
        f"`trainable` {trainable_name(trainable)} does not implement save_checkpoint(), but "
        f"{asks}: implement save_checkpoint() and load_checkpoint(), or run it without "
        "(FIFO, ASHA or median stopping, and no checkpoint_frequency or checkpoint_at_end)"
    )


def _check_param_space(param_space: Any) -> None:
    if param_space is not None and not isinstance(param_space, Mapping):
        raise TypeError(
            f"`param_space` is {param_space!r} ({type(param_space).__name__}), but must be a "
            "dict of hyperparameter names to values or search spaces"
        )
    _check_keys(param_space, "param_space")


def _check_keys(value: Any, where: str) -> None:
    """Every dict in ``value`` (a config, nested dicts, lists and ``choice`` categories
    included) has string keys: ``params.json`` and the commits keep JSON object keys,
    so a resumed trial would see ``{1: 2}`` come back as ``{"1": 2}``."""
    if isinstance(value, Mapping):
        for key, sub in value.items():
            if not isinstance(key, str):
                raise TypeError(
                    f"`{where}` has the key {key!r} ({type(key).__name__}), but every key in "
                    f"`param_space` must be a string ({PARAMS} and a resume keep string "
                    "keys only)"
                )
            _check_keys(sub, f"{where}[{key!r}]")
    elif isinstance(value, list | tuple):
        for i, sub in enumerate(value):
            _check_keys(sub, f"{where}[{i}]")
    elif isinstance(value, Categorical):
        for i, sub in enumerate(value.categories):
            _check_keys(sub, f"{where}.categories[{i}]")


def _kept_from_run(
    scheduler: TrialScheduler, tune_config: TuneConfig, resuming: ResumeSpec
) -> bool:
    """A resumed run's scheduler already has the run's metric and mode: the first run
    set them on it, and ``run_args.json`` keeps both (so a searcher gets them again)."""
    return bool(resuming.resume) and all(
        getattr(tune_config, k) in (None, getattr(scheduler, k)) for k in ("metric", "mode")
    )


def check_search_alg(
    search_alg: Any, metric: str | None, mode: str | None, param_space: dict[str, Any] | None
) -> None:
    """What Ray refuses of a ``search_alg``, before anything starts: a metric or mode
    unlike the run's, a search space of its own beside one in ``param_space``, no metric
    at all. Checked on a copy: the run's searcher is set up by the driver."""
    for what, run_value in (("metric", metric), ("mode", mode)):
        own = getattr(search_alg, what, None)
        if own is not None and run_value is not None and own != run_value:
            raise ValueError(
                f"`{what}` is {run_value!r} for the run but {own!r} for the search_alg "
                f"({type(search_alg).__name__}); set it in one place only"
            )
    probe = copy.deepcopy(search_alg)
    took = probe.set_search_properties(metric, mode, dict(param_space or {}), num_samples=1)
    if not took and has_search_spaces(param_space or {}):
        raise ValueError(
            "You passed a `param_space` with search spaces to run(), but the search_alg "
            f"({type(search_alg).__name__}) was already given a search space of its own. "
            "Make sure that `param_space` holds no more search spaces: put them all in "
            "the search algorithm's space"
        )
    if getattr(probe, "bounded_by_num_samples", True) and probe.metric is None:
        raise ValueError(
            f"the search_alg ({type(search_alg).__name__}) has no metric to learn from: pass "
            "`metric` and `mode` to run() (or TuneConfig), or to the search algorithm"
        )


#: Trials sampled up front at most (no ``search_alg``): each is a record in memory and a
#: row of every commit (~1 KB and ~0.3 ms each, measured), so a billion would exhaust
#: memory before the first segment. A searcher makes its trials one at a time.
MAX_EAGER_TRIALS = 100_000


def check_eager_trials(param_space: Mapping[str, Any], num_samples: int) -> None:
    """ValueError naming ``num_samples`` if ``param_space`` sampled ``num_samples`` times
    (each grid point ``num_samples`` times) is more than :data:`MAX_EAGER_TRIALS` trials."""
    per_sample = count_variants(param_space, 1)
    if per_sample > MAX_EAGER_TRIALS:
        raise ValueError(
            f"`param_space`'s grid_search values make {per_sample} trials, but at most "
            f"{MAX_EAGER_TRIALS} are sampled up front; search fewer grid points, or pass a "
            "`search_alg`, which suggests trials one at a time"
        )
    if per_sample * num_samples > MAX_EAGER_TRIALS:
        grid = f" times {per_sample} grid points" if per_sample > 1 else ""
        raise ValueError(
            f"`num_samples` is {num_samples}, but must be between 1 and "
            f"{max(1, MAX_EAGER_TRIALS // per_sample)} here: {num_samples}{grid} is more "
            f"than the {MAX_EAGER_TRIALS} trials popflow samples up front; a `search_alg` "
            "suggests trials one at a time, with no such bound"
        )


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
    tune_config: TuneConfig,
    run_config: RunConfig,
    storage: StorageSpec,
    cluster: ClusterSpec | None = None,
    budget: BudgetSpec | None = None,
    resuming: ResumeSpec | None = None,
) -> RunSpec:
    """The run's checked groups, and what only the whole run can check (and that an
    object store's bucket is there), as one spec. ``run_config``'s storage is not read:
    ``storage`` is where the experiment goes."""
    _check_trainable(trainable)
    _check_param_space(param_space)
    cluster, budget = cluster or ClusterSpec(), budget or BudgetSpec()
    resuming = resuming or ResumeSpec()
    for argument, group, kind in (
        ("tune_config", tune_config, TuneConfig),
        ("run_config", run_config, RunConfig),
        ("storage", storage, StorageSpec),
        ("cluster", cluster, ClusterSpec),
        ("budget", budget, BudgetSpec),
        ("resuming", resuming, ResumeSpec),
    ):
        if not isinstance(group, kind):
            raise TypeError(f"`{argument}` is {group!r}, but must be a {kind.__name__}")
    if run_config.checkpoint_config is not None and is_function_trainable(trainable):
        _check_function_checkpoints(run_config.checkpoint_config)
    if cluster.resources_per_trial is None and resources_of(trainable) is not None:
        cluster = dataclasses.replace(cluster, resources_per_trial=resources_of(trainable))
    scheduler = tune_config.scheduler if tune_config.scheduler is not None else FIFOScheduler()
    if not scheduler.set_search_properties(
        tune_config.metric, tune_config.mode
    ) and not _kept_from_run(scheduler, tune_config, resuming):
        raise ValueError(
            "`metric`/`mode` were passed to run() but the scheduler already has its own; "
            "set them in one place only"
        )
    _check_class_saves(trainable, run_config.checkpoint_config, scheduler)
    if tune_config.search_alg is None:  # the trials are sampled up front: bounded
        check_eager_trials(param_space or {}, tune_config.num_samples)
    if tune_config.search_alg is not None:
        check_search_alg(tune_config.search_alg, tune_config.metric, tune_config.mode, param_space)
    name = run_config.name
    name = (
        expand_name(name)
        if name
        else f"{trainable_name(trainable)}_{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    )
    check_name(name)  # a made-up name too: it holds the trainable's name
    check_experiment_path(storage.storage, name)
    _check_reachable(storage.storage, name)
    return RunSpec(
        trainable=trainable,
        param_space=dict(param_space or {}),
        name=name,
        tune_config=dataclasses.replace(
            tune_config,
            scheduler=scheduler,
            max_concurrent_trials=tune_config.max_concurrent_trials or None,
        ),
        run_config=dataclasses.replace(
            run_config,
            name=None,  # the spec's own `name` is the experiment's
            storage_path=None,
            storage_options=None,  # credentials: only `storage_spec` holds them, hidden
            failure_config=run_config.failure_config or FailureConfig(),
            checkpoint_config=run_config.checkpoint_config or CheckpointConfig(),
            callbacks=check_callbacks(run_config.callbacks),
        ),
        storage_spec=storage,
        cluster=cluster,
        budget=budget,
        resuming=resuming,
    )
