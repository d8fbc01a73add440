"""Ray 2.60's ``Tuner.get_results`` and every ``Tuner.restore`` option: ``resume_unfinished``
(False ends the unfinished trials, TERMINATED), ``trainable`` and ``param_space``
re-specified (checked against the experiment's, as Ray checks them) and
``storage_filesystem`` (an fsspec filesystem here)."""

from __future__ import annotations

import fsspec
import pytest
from trainables import FlakyTrainable, ParityTrainable

from popflow import run, tune
from popflow.schedulers import PopulationBasedTraining, grid_search
from popflow.tune import Tuner

pytestmark = pytest.mark.integration

SPACE = {"a": grid_search([1, 3]), "nested": {"c": 1}}


def pbt() -> PopulationBasedTraining:
    return PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=1,
        hyperparam_mutations={"nested": {"c": [1]}},
        synch=True,
    )


@pytest.fixture
def unfinished(initialised, tmp_path) -> str:
    """An experiment stopped after its first round (of 3 iterations): its path."""
    grid = run(
        ParityTrainable,
        SPACE,
        scheduler=pbt(),
        metric="mean_accuracy",
        mode="max",
        stop={"training_iteration": 3},
        name="unfinished",
        storage=str(tmp_path / "results"),
        seed=0,
        max_rounds=1,
        verbose=0,
        dask_address=initialised,
    )
    assert [r.metrics["training_iteration"] for r in grid] == [1, 1]
    assert all(r.status != "TERMINATED" for r in grid)
    return grid.experiment_path


def test_get_results_of_a_tuner_never_fit_raises_rays_error():
    with pytest.raises(RuntimeError, match=r"has not been run, yet\. Call `Tuner.fit\(\)`"):
        Tuner(ParityTrainable).get_results()


def test_get_results_after_restore_reads_the_experiment_without_running_it(unfinished):
    grid = Tuner.restore(unfinished, trainable=ParityTrainable).get_results()
    assert [r.metrics["training_iteration"] for r in grid] == [1, 1]
    assert all(r.status != "TERMINATED" for r in grid)
    assert grid.experiment_path == unfinished
    # nothing ran: the experiment is as it was, and goes on when fit
    tuner = Tuner.restore(unfinished, trainable=ParityTrainable)
    done = tuner.fit()  # (the run's max_rounds=1 is kept with it: one more round)
    assert [r.metrics["training_iteration"] for r in done] == [2, 2]
    assert tuner.get_results() is done


def test_resume_unfinished_false_ends_the_unfinished_trials_as_terminated(unfinished):
    tuner = Tuner.restore(unfinished, trainable=ParityTrainable, resume_unfinished=False)
    grid = tuner.fit()
    assert [r.status for r in grid] == ["TERMINATED", "TERMINATED"]
    assert [r.metrics["training_iteration"] for r in grid] == [1, 1]  # not run again
    assert [len(r.history) for r in grid] == [1, 1]
    assert tuner.get_results() is grid
    # the experiment is finished now: a default restore has nothing left to run
    again = Tuner.restore(unfinished, trainable=ParityTrainable).fit()
    assert [r.metrics["training_iteration"] for r in again] == [1, 1]


def test_a_respecified_trainable_or_param_space_is_checked_as_ray_checks_it(unfinished):
    with pytest.raises(ValueError, match=r"Invalid `trainable`.*'FlakyTrainable' but expected"):
        Tuner.restore(unfinished, trainable=FlakyTrainable)
    with pytest.raises(ValueError, match=r"Invalid `param_space`(.|\n)*Got: \['a', 'b'\]"):
        Tuner.restore(unfinished, trainable=ParityTrainable, param_space={"a": 1, "b": 2})
    with pytest.raises(ValueError, match="Invalid `param_space`"):  # a nested key changed
        Tuner.restore(unfinished, ParityTrainable, param_space={"a": 1, "nested": {"d": 1}})
    # the same keys: taken (Ray uses it only to hand objects over anew)
    grid = Tuner.restore(
        unfinished,
        trainable=ParityTrainable,
        param_space={"a": grid_search([1, 3]), "nested": {"c": 1}},
    ).fit()
    assert [r.metrics["training_iteration"] for r in grid] == [2, 2]


def test_storage_filesystem_is_an_fsspec_filesystem(unfinished):
    fs = fsspec.filesystem("file")
    grid = Tuner.restore(unfinished, ParityTrainable, storage_filesystem=fs).get_results()
    assert [r.metrics["training_iteration"] for r in grid] == [1, 1]
    with pytest.raises(
        TypeError, match="`storage_filesystem` is object, but popflow takes an fsspec"
    ):
        Tuner.restore(unfinished, ParityTrainable, storage_filesystem=object())
    with pytest.raises(TypeError, match="`resume_unfinished` is 'no', but must be a bool"):
        Tuner.restore(unfinished, ParityTrainable, resume_unfinished="no")


def test_tune_tuner_is_popflows():
    assert tune.Tuner is Tuner
