"""Ray Tune's front door: ``Tuner``/``TuneConfig``/``RunConfig``/``FailureConfig`` and
``popflow.init`` map onto ``popflow.run``; what popflow cannot honour raises at once."""

from __future__ import annotations

import dataclasses
import os

import pytest
from trainables import FlakyTrainable, ParityTrainable

import popflow
from popflow import run, tune
from popflow.flows.spec.config import check_verbose
from popflow.schedulers import PopulationBasedTraining, grid_search, sample_from
from popflow.tune import (
    CheckpointConfig,
    FailureConfig,
    RunConfig,
    TrialError,
    TuneConfig,
    Tuner,
    Unsupported,
)

#: Ray Tune 2.x's fields and defaults (ray 2.60's dataclasses), popflow's extras last.
RAY_DEFAULTS = {
    TuneConfig: {
        "mode": None,
        "metric": None,
        "search_alg": None,
        "scheduler": None,
        "num_samples": 1,
        "max_concurrent_trials": None,
        "time_budget_s": None,
        "reuse_actors": False,
        "trial_name_creator": None,
        "trial_dirname_creator": None,
    },
    RunConfig: {
        "name": None,
        "storage_path": None,
        "storage_filesystem": None,
        "failure_config": None,
        "checkpoint_config": None,
        "sync_config": None,
        "verbose": None,
        "stop": None,
        "callbacks": None,
        "progress_reporter": None,
        "log_to_file": False,
        "local_dir": None,
    },
    FailureConfig: {"max_failures": 0, "fail_fast": False},
    CheckpointConfig: {
        "num_to_keep": None,
        "checkpoint_score_attribute": None,
        "checkpoint_score_order": "max",
        "checkpoint_frequency": 0,
        "checkpoint_at_end": None,
    },
}


@pytest.mark.unit
@pytest.mark.parametrize("cls", list(RAY_DEFAULTS))
def test_config_classes_have_rays_fields_and_defaults(cls):
    fields = {f.name: f.default for f in dataclasses.fields(cls)}
    ray = RAY_DEFAULTS[cls]
    assert list(fields)[: len(ray)] == list(ray)
    assert {k: fields[k] for k in ray} == ray


@pytest.mark.unit
@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: RunConfig(storage_filesystem=object()), "storage_filesystem"),
        (lambda: RunConfig(sync_config=object()), "sync_config"),
        (lambda: RunConfig(local_dir="/tmp"), "local_dir"),
        (lambda: RunConfig(progress_reporter=object()), "progress_reporter"),
    ],
)
def test_what_popflow_cannot_honour_raises_at_once_naming_the_argument(make, argument):
    with pytest.raises(Unsupported, match=f"`{argument}="):
        make()


@pytest.mark.unit
@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: RunConfig(verbose=7), "`verbose` is 7"),
        (lambda: TuneConfig(reuse_actors="yes"), "`reuse_actors` must be a bool"),
        (lambda: Tuner(ParityTrainable, tune_config=RunConfig()), "`tune_config` must be"),
        (lambda: Tuner(ParityTrainable, run_config=TuneConfig()), "`run_config` must be"),
        (lambda: Tuner(), "needs a trainable"),
        (lambda: popflow.init("tcp://x:1", num_cpus=2), "not both"),
        (lambda: popflow.init(num_cpus=0), "`num_cpus` is 0"),
        (
            lambda: run(lambda c: None, checkpoint_config=CheckpointConfig(checkpoint_at_end=True)),
            "'checkpoint_at_end' cannot be used with a function trainable",
        ),
        (
            lambda: run(lambda c: None, checkpoint_config=CheckpointConfig(checkpoint_frequency=2)),
            "'checkpoint_frequency' cannot be set for a function trainable",
        ),
    ],
)
def test_bad_values_are_refused_with_their_name(make, message):
    with pytest.raises((TypeError, ValueError), match=message):
        make()


@pytest.mark.unit
@pytest.mark.parametrize(("given", "level"), [(False, 0), (True, 1), (3, 3), (None, 2)])
def test_verbose_takes_rays_bools_as_0_and_1(given, level):
    """Ray's own examples pass ``RunConfig(verbose=False)``; Ray reads a bool as an int."""
    assert check_verbose(RunConfig(verbose=given).verbose) == level
    assert type(check_verbose(given)) is int


def parity_space() -> dict:
    values = iter([10, 20, 40])
    return {"a": sample_from(lambda _: next(values)), "c": 1}


def parity_pbt() -> PopulationBasedTraining:
    return PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=1,
        hyperparam_mutations={"c": lambda: 1},
        synch=True,
    )


@pytest.mark.integration
def test_a_tuner_runs_what_run_runs_and_restores(initialised, tmp_path):
    storage = str(tmp_path / "results")
    tuner = tune.Tuner(
        ParityTrainable,
        param_space=parity_space(),
        tune_config=tune.TuneConfig(
            metric="mean_accuracy", mode="max", scheduler=parity_pbt(), num_samples=3, seed=0
        ),
        run_config=tune.RunConfig(
            name="tuner",
            storage_path=storage,
            stop={"training_iteration": 3},
            checkpoint_config=CheckpointConfig(checkpoint_frequency=1),
            failure_config=FailureConfig(max_failures=1),
            verbose=0,
        ),
    )
    results = tuner.fit()
    direct = run(
        ParityTrainable,
        parity_space(),
        scheduler=parity_pbt(),
        metric="mean_accuracy",
        mode="max",
        num_samples=3,
        stop={"training_iteration": 3},
        checkpoint_config=CheckpointConfig(checkpoint_frequency=1),
        storage=storage,
        name="direct",
        seed=0,
        max_failures=1,
        dask_address=initialised,
    )
    assert [r.metrics["mean_accuracy"] for r in results] == [43, 43, 43]
    assert [r.config for r in results] == [r.config for r in direct]
    assert results.experiment_path == os.path.join(storage, "tuner")

    path = results.experiment_path
    assert Tuner.can_restore(path) and not Tuner.can_restore(str(tmp_path / "nothing"))
    again = Tuner.restore(path, ParityTrainable).fit()  # finished: the same results back
    assert [r.metrics for r in again] == [r.metrics for r in results]
    with pytest.raises(ValueError, match="nothing to restore"):
        Tuner.restore(str(tmp_path / "nothing"), ParityTrainable)


@pytest.mark.integration
@pytest.mark.parametrize("fail_fast", [True, "raise"])
def test_fail_fast_ends_the_experiment_at_the_first_error(tune_env, fail_fast):
    """One trial errors at iteration 3; the others would run 10,000 iterations."""
    kwargs = dict(
        param_space={"fail_at": grid_search([None, 3, None])},
        stop={"training_iteration": 10_000},
        checkpoint_config=CheckpointConfig(checkpoint_frequency=1),  # 1-iteration segments
        metric="score",
        mode="max",
        name=f"fail-fast-{fail_fast}",
        fail_fast=fail_fast,
        **tune_env,
    )
    if fail_fast == "raise":
        with pytest.raises(TrialError, match="boom at iteration 3"):
            run(FlakyTrainable, **kwargs)
        return
    results = run(FlakyTrainable, **kwargs)
    assert results.num_errors == 1
    assert [r.status for r in results] == ["TERMINATED", "ERROR", "TERMINATED"]
    # a trial may not have started before the error ended the run: no metrics at all
    assert all(r.metrics.get("training_iteration", 0) < 1000 for r in results)
    assert "boom at iteration 3" in str(results[1].error)


@pytest.mark.unit
def test_fail_fast_is_checked():
    with pytest.raises(ValueError, match="`fail_fast` is 'yes'"):
        run(FlakyTrainable, fail_fast="yes")


@pytest.mark.integration
def test_with_resources_sets_what_each_trial_holds(tune_env):
    try:
        trainable = tune.with_resources(FlakyTrainable, {"cpu": 10_000})
        assert trainable is FlakyTrainable
        with pytest.raises(ValueError, match=r"needing \{'CPU': 10000.0\}"):
            run(trainable, stop={"training_iteration": 1}, name="too-big", **tune_env)
        tune.with_resources(FlakyTrainable, {"cpu": 20_000})  # the last call counts
        with pytest.raises(ValueError, match=r"needing \{'CPU': 20000.0\}"):
            run(FlakyTrainable, stop={"training_iteration": 1}, name="bigger", **tune_env)
    finally:
        tune.with_resources(FlakyTrainable, {})  # other tests use FlakyTrainable too
    with pytest.raises(TypeError, match="must be a dict"):
        tune.with_resources(FlakyTrainable, lambda config: {"cpu": 1})


@pytest.mark.unit
def test_mock_trainable_climbs_its_sigmoid_and_checkpoints(tmp_path):
    import math

    from popflow.tune.utils.mock_trainable import MyTrainableClass

    agent = MyTrainableClass({"width": 4, "height": 10})
    rewards = [agent.step()["episode_reward_mean"] for _ in range(3)]
    assert rewards == [10 * math.tanh(t / 4) for t in (1, 2, 3)]
    agent.save_checkpoint(str(tmp_path))
    again = MyTrainableClass({"width": 4, "height": 10, "mock_error": True})
    again.load_checkpoint(str(tmp_path))
    assert again.step()["episode_reward_mean"] == 10 * math.tanh(4 / 4)  # restored: no error
    fresh = MyTrainableClass({"mock_error": True})
    fresh.step()
    with pytest.raises(RuntimeError, match="failing on purpose"):
        fresh.step()
