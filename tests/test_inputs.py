"""Bad input fails at once, with a message naming the argument, before anything is written."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from trainables import ParityTrainable

from popflow import (
    ASHAScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    PopulationBasedTraining,
    run,
)

pytestmark = pytest.mark.unit


def pbt(**kwargs: Any) -> PopulationBasedTraining:
    return PopulationBasedTraining(
        time_attr="training_iteration", hyperparam_mutations={"c": [1, 2]}, **kwargs
    )


SCHEDULERS = [
    (lambda: pbt(synch="no"), TypeError, r"`synch` is 'no', but must be True or False"),
    (lambda: pbt(log_config=1), TypeError, r"`log_config` is 1, but must be True or False"),
    (
        lambda: pbt(perturbation_factors=("a", "b")),
        TypeError,
        r"`perturbation_factors` is \('a', 'b'\), but must hold numbers",
    ),
    (
        lambda: MedianStoppingRule(hard_stop="no"),
        TypeError,
        r"`hard_stop` is 'no', but must be True or False",
    ),
    (
        lambda: HyperBandScheduler(max_t=100, reduction_factor=1.0001),
        ValueError,
        r"`reduction_factor` is 1\.0001 with `max_t` 100 \(from 1\.0\): that makes 46,055 rungs",
    ),
    (
        lambda: ASHAScheduler(max_t=10**9, reduction_factor=1.000001),
        ValueError,
        r"`reduction_factor` is 1\.000001 with `max_t` 1000000000 .* rungs, but popflow allows",
    ),
    (lambda: ASHAScheduler(max_t=math.inf), ValueError, r"`max_t` is inf, but must be finite"),
    (lambda: HyperBandScheduler(max_t=math.inf), ValueError, r"`max_t` is inf, but must be"),
    (
        lambda: HyperBandScheduler(stop_last_trials="yes"),
        TypeError,
        r"`stop_last_trials` is 'yes', but must be True or False",
    ),
]


@pytest.mark.parametrize(("make", "error", "message"), SCHEDULERS)
def test_scheduler_arguments_are_checked_at_once(make, error, message) -> None:
    with pytest.raises(error, match=message):  # rung counts are checked before any is built
        make()


RUNS: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"name": "../escape"}, ValueError, r"`name` is '\.\./escape', but must be a folder name"),
    ({"name": "/abs/path"}, ValueError, r"`name` is '/abs/path'"),
    ({"name": "a//b"}, ValueError, r"`name` is 'a//b'"),
    ({"name": "a/./b"}, ValueError, r"`name` is 'a/\./b'"),
    ({"name": ""}, ValueError, r"`name` is ''"),
    ({"name": 3}, TypeError, r"`name` is 3, but must be a string"),
    ({"seed": "abc"}, TypeError, r"`seed` is 'abc', but must be an int >= 0"),
    ({"seed": -1}, TypeError, r"`seed` is -1, but must be an int >= 0"),
    ({"param_space": [1, 2]}, TypeError, r"`param_space` is \[1, 2\] \(list\), but must be a dict"),
    (
        {"stop": {"training_iteration": "3"}},
        TypeError,
        r"`stop\['training_iteration'\]` is '3' \(str\), but must be a number",
    ),
    ({"stop": 3}, TypeError, r"`stop` must be a dict, a callable"),
    ({"n_workers": "2"}, TypeError, r"`n_workers` is '2', but must be an int >= 1"),
    ({"n_workers": 0}, TypeError, r"`n_workers` is 0, but must be an int >= 1"),
    ({"commit_interval": "1"}, TypeError, r"`commit_interval` is '1', but must be a number > 0"),
    ({"commit_interval": 0}, ValueError, r"`commit_interval` is 0, but must be > 0"),
    ({"log_flush_interval": -5}, ValueError, r"`log_flush_interval` is -5, but must be >= 0"),
    ({"lease_ttl": 0}, ValueError, r"`lease_ttl` is 0, but must be > 0"),
    ({"lease_ttl": math.inf}, ValueError, r"`lease_ttl` is inf, but must be finite"),
    ({"resume": 1}, ValueError, r"`resume` is 1, but must be False, True or 'auto'"),
    ({"resume": "yes"}, ValueError, r"`resume` is 'yes'"),
    ({"num_samples": 0}, ValueError, r"`num_samples` is 0, but must be an int >= 1"),
    ({"num_samples": True}, ValueError, r"`num_samples` is True"),
    ({"max_failures": 1.5}, ValueError, r"`max_failures` is 1\.5"),
    ({"mode": "maximize"}, ValueError, r"`mode` is 'maximize', but must be 'min' or 'max'"),
    ({"metric": 3}, TypeError, r"`metric` is 3, but must be a result key"),
    ({"scheduler": "pbt"}, TypeError, r"`scheduler` must be a popflow.TrialScheduler"),
    ({"checkpoint_config": {"num_to_keep": 1}}, TypeError, r"`checkpoint_config` is"),
    ({"resources_per_trial": ["cpu"]}, TypeError, r"`resources_per_trial` is \['cpu'\]"),
    ({"resources_per_trial": {"cpu": -1}}, ValueError, r"`resources_per_trial\['cpu'\]` is -1"),
    ({"dask_address": 8786}, TypeError, r"`dask_address` is 8786, but must be a scheduler"),
    ({"segment_timeout_s": 0}, ValueError, r"`segment_timeout_s` is 0, but must be > 0"),
]


@pytest.mark.parametrize(("kwargs", "error", "message"), RUNS)
def test_run_arguments_are_checked_before_anything_is_written(
    tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    storage = tmp_path / "results"
    args: dict[str, Any] = {"storage": str(storage), "name": "exp", "seed": 0, **kwargs}
    param_space = args.pop("param_space", {"a": 1})
    with pytest.raises(error, match=message):
        run(ParityTrainable, param_space, **args)
    assert not storage.exists()
