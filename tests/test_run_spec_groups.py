"""The run's arguments have one home: Ray's grouped configs (``TuneConfig``, ``RunConfig``,
``FailureConfig``, ``CheckpointConfig``) and popflow's own groups (storage, cluster,
budget, resume) check themselves when made; ``run``, ``Tuner`` and ``tune.run`` put
them into one :class:`RunSpec`, built once; ``run_args.json`` keeps them as before.

Unit tests: nothing starts (``run`` is stopped at the cluster it would start next).
"""

from __future__ import annotations

import inspect
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from trainables import ParityTrainable

from popflow import CheckpointConfig, run, tune
from popflow.flows.api import launch
from popflow.flows.spec.groups import BudgetSpec, ClusterSpec, ResumeSpec, StorageSpec
from popflow.flows.spec.ray_configs import FailureConfig, RunConfig, TuneConfig
from popflow.flows.spec.run_args import RUN_ARGS_FILE, load_run_args, save_run_args
from popflow.flows.spec.run_spec import RUN_ARGUMENTS, STORED_ARGUMENTS, RunSpec
from popflow.infra.storage.folder import Storage
from popflow.schedulers import PopulationBasedTraining

pytestmark = pytest.mark.unit

NAN = math.nan

#: (a group made with a bad value, the error, its message): the messages run() gives
GROUPS: list[tuple[Any, type[Exception], str]] = [
    (lambda: TuneConfig(num_samples=0), ValueError, r"`num_samples` is 0, but must be an int >= 1"),
    (lambda: TuneConfig(metric=3), TypeError, r"`metric` is 3, but must be a result key"),
    (lambda: TuneConfig(mode="maximize"), ValueError, r"`mode` is 'maximize', but must be"),
    (lambda: TuneConfig(scheduler="pbt"), TypeError, r"`scheduler` must be a popflow.TrialSch"),
    (lambda: TuneConfig(seed=True), TypeError, r"`seed` is True, but must be an int >= 0"),
    (lambda: TuneConfig(time_budget_s=NAN), ValueError, r"`time_budget_s` is nan, but must be"),
    (lambda: TuneConfig(max_concurrent_trials=-1), ValueError, r"`max_concurrent_trials` is -1"),
    (lambda: TuneConfig(trial_name_creator="x"), TypeError, r"`trial_name_creator` is 'x'"),
    (lambda: RunConfig(name="a\nb"), ValueError, r"`name` is 'a\\nb', but must not hold"),
    (lambda: RunConfig(stop={"it": NAN}), ValueError, r"`stop\['it'\]` is nan"),
    (lambda: RunConfig(stop=3), TypeError, r"`stop` must be a dict, a callable"),
    (lambda: RunConfig(callbacks=[object()]), TypeError, r"does not subclass popflow\.tune"),
    (lambda: RunConfig(verbose=7), ValueError, r"`verbose` is 7"),
    (
        lambda: RunConfig(checkpoint_config={"num_to_keep": 1}),
        TypeError,
        r"`checkpoint_config` is \{'num_to_keep': 1\}, but must be a popflow.CheckpointConfig",
    ),
    (lambda: RunConfig(failure_config=3), TypeError, r"`failure_config` is 3, but must be a"),
    (lambda: FailureConfig(max_failures=True), ValueError, r"`max_failures` is True"),
    (lambda: FailureConfig(max_failures=-2), ValueError, r"`max_failures` is -2, but must be"),
    (lambda: FailureConfig(fail_fast="yes"), ValueError, r"`fail_fast` is 'yes'"),
    (lambda: CheckpointConfig(num_to_keep=0), ValueError, r"`num_to_keep` is 0"),
    (lambda: StorageSpec("./results"), TypeError, r"`storage` is './results', but must be a"),
    (lambda: storage_spec(commit_interval=0), ValueError, r"`commit_interval` is 0, but must"),
    (lambda: storage_spec(log_flush_interval=-5), ValueError, r"`log_flush_interval` is -5"),
    (lambda: storage_spec(lease_ttl=math.inf), ValueError, r"`lease_ttl` is inf, but must be"),
    (lambda: ClusterSpec(dask_address=8786), TypeError, r"`dask_address` is 8786, but must be"),
    (lambda: ClusterSpec(n_workers=0), TypeError, r"`n_workers` is 0, but must be an int >= 1"),
    (
        lambda: ClusterSpec(resources_per_trial={"cpu": NAN}),
        ValueError,
        r"`resources_per_trial\['cpu'\]` is nan, but must be a number >= 0 and finite",
    ),
    (lambda: BudgetSpec(max_rounds=0), ValueError, r"`max_rounds` is 0, but must be an int >= 1"),
    (lambda: BudgetSpec(segment_timeout_s=0), ValueError, r"`segment_timeout_s` is 0, but must"),
    (lambda: ResumeSpec(resume="yes"), ValueError, r"`resume` is 'yes', but must be False"),
    (lambda: ResumeSpec(errored="retry"), ValueError, r"`errored` is 'retry', but must be"),
]


def storage_spec(**kwargs: Any) -> StorageSpec:
    return StorageSpec(Storage("./results"), **kwargs)


@pytest.mark.parametrize(("make", "error", "message"), GROUPS)
def test_each_group_checks_itself_when_made(make, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        make()


def test_the_groups_are_frozen_and_derive_what_they_can() -> None:
    cluster = ClusterSpec(resources_per_trial={"cpu": 2, "gpu": 0})
    assert cluster.resources == {"CPU": 2.0}  # Dask's names, once
    with pytest.raises(AttributeError):
        cluster.n_workers = 3  # type: ignore[misc]


class Built:
    """``run_spec`` as ``launch`` calls it, counted; ``run`` is stopped at the cluster."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.specs: list[RunSpec] = []
        real = launch.run_spec

        def counted(*args: Any, **kwargs: Any) -> RunSpec:
            self.specs.append(real(*args, **kwargs))
            return self.specs[-1]

        monkeypatch.setattr(launch, "run_spec", counted)
        for started in ("ClusterStart", "PrefectRecord", "train"):
            monkeypatch.setattr(launch, started, self._stop)

    @staticmethod
    def _stop(*args: Any, **kwargs: Any) -> Any:
        raise Reached

    def spec_of(self, door: Any) -> RunSpec:
        with pytest.raises(Reached):
            door()
        (spec,) = self.specs  # built once
        self.specs.clear()
        return spec


class Reached(Exception):
    """``run`` checked everything and went on to start the cluster."""


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> Built:
    return Built(monkeypatch)


def pbt() -> PopulationBasedTraining:
    return PopulationBasedTraining(perturbation_interval=2, hyperparam_mutations={"a": [1, 2]})


def test_every_door_builds_the_spec_once_from_the_same_groups(tmp_path: Path, built) -> None:
    storage = str(tmp_path / "results")
    checkpoints = CheckpointConfig(num_to_keep=2)
    scheduler = pbt()
    tune_config = TuneConfig(metric="score", mode="max", scheduler=scheduler, seed=3)
    run_config = RunConfig(
        name="tuner",
        storage_path=storage,
        failure_config=FailureConfig(max_failures=2),
        checkpoint_config=checkpoints,
        stop={"training_iteration": 2},
    )
    spec = built.spec_of(
        lambda: tune.Tuner(
            ParityTrainable, param_space={"a": 1}, tune_config=tune_config, run_config=run_config
        ).fit()
    )
    assert spec.tune_config.scheduler is scheduler and spec.checkpoint_config is checkpoints
    assert spec.run_config.failure_config is run_config.failure_config
    assert (spec.name, spec.seed, spec.max_failures, spec.metric) == ("tuner", 3, 2, "score")

    flat = built.spec_of(
        lambda: run(
            ParityTrainable,
            {"a": 1},
            scheduler=pbt(),
            metric="score",
            mode="max",
            seed=3,
            max_failures=2,
            checkpoint_config=checkpoints,
            stop={"training_iteration": 2},
            storage=storage,
            name="tuner",
        )
    )
    legacy = built.spec_of(
        lambda: tune.run(
            ParityTrainable,
            config={"a": 1},
            scheduler=pbt(),
            metric="score",
            mode="max",
            seed=3,
            max_failures=2,
            checkpoint_config=checkpoints,
            stop={"training_iteration": 2},
            storage_path=storage,
            name="tuner",
        )
    )
    for other in (flat, legacy):  # the same groups, whichever door made them
        assert other.tune_config == replace(spec.tune_config, scheduler=other.scheduler)
        assert other.storage_spec == replace(spec.storage_spec, storage=other.storage)
        assert other.storage.url == spec.storage.url
        assert (other.run_config, other.cluster, other.budget, other.resuming) == (
            spec.run_config,
            spec.cluster,
            spec.budget,
            spec.resuming,
        )


def test_every_argument_of_run_reads_from_the_spec_under_its_name(tmp_path, built) -> None:
    parameters = set(inspect.signature(run).parameters) - {"storage_options"}
    assert set(RUN_ARGUMENTS) == parameters
    spec = built.spec_of(lambda: run(ParityTrainable, {"a": 1}, storage=str(tmp_path)))
    for name in RUN_ARGUMENTS:
        getattr(spec, name)
    assert str(spec.storage.url).endswith(str(tmp_path).lstrip("/"))
    assert spec.resources is None and spec.scheduler.__class__.__name__ == "FIFOScheduler"


#: ``.popflow/run_args.json`` as main's code (before the groups) wrote it for a PBT run
MAIN_RUN_ARGS = json.loads(
    '{"format": 1, "args": {"trainable": {"$popflow": "import", "path": "trainables:ParityTrainable"}, "param_space": {"a": {"grid_search": [1, 2]}, "lr": {"$popflow": "domain", "class": "LogUniform", "fields": {"lower": 0.0001, "upper": 0.1, "base": 10.0}}}, "scheduler": {"$popflow": "object", "class": "popflow.schedulers.pbt:PopulationBasedTraining", "kwargs": {"time_attr": "training_iteration", "perturbation_interval": 2, "hyperparam_mutations": {"lr": {"$popflow": "domain", "class": "Uniform", "fields": {"lower": 0.0, "upper": 1.0}}}, "metric": "mean_accuracy", "mode": "max"}}, "num_samples": 2, "stop": {"training_iteration": 4}, "checkpoint_config": {"$popflow": "object", "class": "popflow.flows.spec.config:CheckpointConfig", "kwargs": {"num_to_keep": 1, "checkpoint_score_attribute": null, "checkpoint_score_order": "max", "checkpoint_frequency": 2, "checkpoint_at_end": null}}, "seed": 7, "max_failures": 2, "resources_per_trial": {"cpu": 1}, "commit_interval": 0.5, "log_flush_interval": 10.0, "lease_ttl": 30.0, "segment_timeout_s": 100.0, "fail_fast": true, "time_budget_s": 60.0, "max_rounds": 5, "max_concurrent_trials": 3, "callbacks": null, "dask_address": "tcp://127.0.0.1:8786"}}'
)


def test_run_args_written_before_the_groups_resume_and_are_written_the_same(
    tmp_path: Path, built
) -> None:
    old = Storage(str(tmp_path / "old" / "exp"))
    old.write_text(json.dumps(MAIN_RUN_ARGS), RUN_ARGS_FILE)
    saved = load_run_args(old)
    assert set(saved) - {"trainable", "param_space"} == set(STORED_ARGUMENTS)
    spec = built.spec_of(
        lambda: run(**saved, storage=str(tmp_path / "old"), name="exp", resume=True)
    )
    assert (spec.max_rounds, spec.time_budget_s, spec.segment_timeout_s) == (5, 60.0, 100.0)
    assert (spec.resume, spec.fail_fast, spec.resources) == (True, True, {"CPU": 1.0})
    again = Storage(str(tmp_path / "again"))
    save_run_args(again, spec.run_args(7))
    assert json.loads(again.read_text(RUN_ARGS_FILE)) == MAIN_RUN_ARGS
