"""Ray's ``HEBOSearch`` over the real HEBO 0.3.6 (``popflow[hebo]`` and HEBO without its
stale pins): popflow's spaces as HEBO's parameters (and what HEBO cannot search named),
Ray's batches, a small ``Tuner.fit``, the resume property (replaying the committed calls
gives back every suggestion, HEBO's model's included), seeds, bad input refused. HEBO's
model phase takes seconds a suggestion, so the tests keep to few trials past its Sobol
phase (``rand_sample``)."""

from __future__ import annotations

import logging
import sys
from typing import Any

import numpy as np
import pytest
import torch
from hebo.design_space.design_space import DesignSpace
from support.driving import drive, read_experiment
from support.searchers import configs, replayed_suggestions, simulate

import popflow
from popflow import tune
from popflow.tune.search import ConcurrencyLimiter, create_searcher
from popflow.tune.search.hebo import HEBOSearch, convert_search_space


# -- the space -----------------------------------------------------------------------
@pytest.mark.unit
def test_converts_the_spaces_hebo_can_search_as_ray_does(caplog):
    with caplog.at_level(logging.WARNING):
        space = convert_search_space(
            {
                "lr": tune.loguniform(1e-4, 1e-1),
                "net": {"width": tune.randint(2, 9), "act": tune.choice(["relu", "tanh"])},
                "mom": tune.quniform(0, 1, 0.1),
                "units": tune.qrandint(8, 64, 8),
                "heads": tune.lograndint(1, 17),
                "steps": 100,  # a constant: left to the run's param_space
            }
        )
    kinds = {name: type(p).__name__ for name, p in space.paras.items()}
    assert kinds == {
        "lr": "PowPara",
        "net/width": "IntegerPara",
        "net/act": "CategoricalPara",
        "mom": "NumericPara",
        "units": "IntegerPara",
        "heads": "PowIntegerPara",
    }
    # Ray's bounds: an excluded upper bound made inclusive for integers
    assert (space.paras["net/width"].lb, space.paras["net/width"].ub) == (2, 8)
    assert (space.paras["units"].lb, space.paras["units"].ub) == (8, 64)
    assert space.paras["heads"].inverse_transform(np.array([space.paras["heads"].ub]))[0] == 16
    assert space.paras["net/act"].categories == ["relu", "tanh"]
    assert "does not support quantization" in caplog.text
    assert convert_search_space({"steps": 100}) is None


@pytest.mark.unit
@pytest.mark.parametrize(
    ("space", "match"),
    [
        ({"x": tune.randn(0, 1)}, "type `Normal`"),
        ({"x": tune.sample_from(lambda _: 1)}, "type `SampleFrom`"),
        ({"x": tune.grid_search([1, 2])}, "grid_search"),
        ({"x": tune.choice([1, "a"])}, "all strings, all ints"),
        ({"x": tune.choice([[1], [2]])}, "all strings, all ints"),
    ],
)
def test_what_hebo_cannot_search_is_named(space, match):
    with pytest.raises(ValueError, match=match):
        convert_search_space(space)


@pytest.mark.unit
def test_a_nested_space_is_suggested_nested_and_a_design_space_of_your_own_is_used():
    searcher = HEBOSearch(metric="y", mode="min", rand_sample=10)
    searcher.set_search_properties(
        None, None, {"a": {"b": tune.uniform(0, 1)}, "c": tune.choice([True, False]), "k": 3}
    )
    config = searcher.suggest("t0")
    assert set(config) == {"a", "c"} and 0 <= config["a"]["b"] <= 1
    assert isinstance(config["c"], bool)  # not numpy's bool
    own = DesignSpace().parse([{"name": "w", "type": "int", "lb": 1, "ub": 3}])
    searcher = HEBOSearch(own, metric="y", mode="max")
    assert not searcher.set_search_properties(None, None, {"x": 1})
    assert set(searcher.suggest("t0")) == {"w"}


# -- Ray's protocol --------------------------------------------------------------------
@pytest.mark.unit
def test_points_come_first_then_batches_of_max_concurrent():
    """Ray's batches: two suggestions, then None until both trials ended. HEBO draws from
    the searcher's own generators: the process's are left alone (Ray seeds them)."""
    outer = (np.random.get_state()[1].copy(), torch.get_rng_state().clone())
    searcher = HEBOSearch(
        {"x": tune.uniform(0, 1)},
        metric="y",
        mode="min",
        points_to_evaluate=[{"x": 0.5}],
        max_concurrent=2,
        rand_sample=10,
    )
    assert searcher.suggest("t0") == {"x": 0.5}
    second = searcher.suggest("t1")
    assert searcher.suggest("t2") is None
    searcher.on_trial_complete("t0", {"y": 1.0})
    assert searcher.suggest("t2") is None  # the batch is filled until t1 ends too
    searcher.on_trial_complete("t1", {"y": float("nan")})  # not told to HEBO
    third = searcher.suggest("t2")
    assert second != third and len(searcher._opt.y) == 1
    assert (np.random.get_state()[1] == outer[0]).all()
    assert torch.equal(torch.get_rng_state(), outer[1])


@pytest.mark.unit
def test_evaluated_rewards_are_told_to_hebo_as_it_minimises():
    searcher = HEBOSearch(
        {"x": tune.uniform(0, 1)},
        metric="y",
        mode="max",
        points_to_evaluate=[{"x": 0.2}, {"x": 0.8}],
        evaluated_rewards=[1.0, 3.0],
    )
    first = searcher.suggest("t0")
    assert first["x"] not in (0.2, 0.8)  # the points were told, not run
    assert searcher._opt.y.ravel().tolist() == [-1.0, -3.0]
    searcher.add_evaluated_point({"x": 0.5}, 2.0)
    assert searcher._opt.y.ravel().tolist() == [-1.0, -3.0, -2.0]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: HEBOSearch(mode="best"), ValueError, "mode"),
        (lambda: HEBOSearch(max_concurrent=0), ValueError, "at least 1"),
        (lambda: HEBOSearch(random_state_seed="1"), ValueError, "random_state_seed"),
        (lambda: HEBOSearch(space={"x": 1.0}), TypeError, "ONLY popflow search spaces"),
        (lambda: HEBOSearch(space=[1]), TypeError, "DesignSpace"),
        (
            lambda: HEBOSearch(points_to_evaluate=[{"x": 1}], evaluated_rewards=[1, 2]),
            ValueError,
            "do not match",
        ),
        (lambda: HEBOSearch(mode="min").suggest("t0"), RuntimeError, "no search space"),
        (lambda: HEBOSearch({"x": tune.uniform(0, 1)}).suggest("t0"), RuntimeError, "mode"),
        (
            lambda: HEBOSearch(
                {"x": tune.uniform(0, 1)}, mode="min", points_to_evaluate=[{"y": 1}]
            ).suggest("t0"),
            ValueError,
            "no value for",
        ),
    ],
)
def test_bad_hebo_arguments_are_named(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.unit
def test_without_hebo_the_error_names_the_install_lines(monkeypatch):
    for name in ("hebo", "hebo.optimizers.hebo", "hebo.design_space.design_space"):
        monkeypatch.setitem(sys.modules, name, None)  # imports fail as if not installed
    with pytest.raises(ImportError) as e:
        HEBOSearch()
    assert "pip install 'popflow[hebo]' && pip install --no-deps HEBO==0.3.6" in str(e.value)


@pytest.mark.unit
def test_create_searcher_makes_it_by_rays_name():
    searcher = create_searcher("hebo", metric="loss", mode="min", num_samples=3)
    assert isinstance(searcher, HEBOSearch) and (searcher.metric, searcher.mode) == ("loss", "min")


# -- the resume property, and seeds ----------------------------------------------------
@pytest.mark.unit
def test_replaying_the_committed_calls_gives_back_every_suggestion(tmp_path):
    """A point, Sobol's two, then HEBO's model (GP fit, pymoo's evolutionary search), two
    trials at a time: a resume's replay, in a process whose global generators moved on,
    goes on as an uninterrupted run would."""
    searcher = ConcurrencyLimiter(
        HEBOSearch(points_to_evaluate=[{"lr": 0.1}], rand_sample=3), max_concurrent=2
    )
    np.random.seed(11)
    made, again = replayed_suggestions(
        searcher, tmp_path, num_samples=6, scheduler=popflow.ASHAScheduler(max_t=4)
    )
    assert len(made) == 6 and again == made
    assert made[0]["lr"] == 0.1 and len({m["lr"] for m in made}) == 6


@pytest.mark.unit
def test_a_run_is_reproducible_from_its_seed_unless_hebo_is_given_one(tmp_path):
    def once(where: str, seed: int, **kwargs: Any) -> list[dict[str, Any]]:
        searcher = ConcurrencyLimiter(HEBOSearch(rand_sample=10, **kwargs), 2)
        return configs(simulate(tmp_path / where, searcher, num_samples=4, seed=seed))

    first = once("a", 1)
    assert once("b", 1) == first and once("c", 2) != first
    assert len({c["lr"] for c in first}) == 4
    assert once("d", 1, random_state_seed=7) == once("e", 2, random_state_seed=7)


@pytest.mark.system
def test_a_synchronous_run_with_hebo_killed_twice_ends_identical(prefect_server, tmp_path):
    """tests/crash_driver.py ``--search hebo`` (seeded by the run, two trials live, HEBO's
    model for the last ones): SIGKILLed twice and resumed, the run ends as one never
    interrupted, down to every suggested config."""
    extra = ["--search", "hebo", "--num-samples", "10", "--iterations", "8"]
    crashed = str(tmp_path / "crash")
    assert drive(crashed, "exp", "hyperband", kill_at="commit-after:3", extra=extra) != 0
    assert drive(crashed, "exp", "hyperband", kill_at="append:6", extra=extra) != 0
    drive(crashed, "exp", "hyperband", extra=extra)
    drive(str(tmp_path / "ref"), "exp", "hyperband", extra=extra)
    state = read_experiment(str(tmp_path / "crash" / "exp"))
    assert state == read_experiment(str(tmp_path / "ref" / "exp"))
    assert len(state["trials"]) == 10
    assert len({rows[0]["config"]["a"] for rows in state["trials"].values()}) > 5


# -- a Tuner ---------------------------------------------------------------------------
def train(config: dict[str, Any]) -> None:
    for step in range(2):
        tune.report({"loss": (config["x"] - 0.3) ** 2 + config["n"] / (step + 1)})


@pytest.mark.integration
def test_a_tuner_fit_with_hebo_search(prefect_server, dask_cluster, tmp_path):
    popflow.init(dask_cluster)
    tuner = tune.Tuner(
        train,
        param_space={"x": tune.uniform(0, 1), "n": tune.randint(0, 3), "steps": 2},
        tune_config=tune.TuneConfig(
            search_alg=HEBOSearch(max_concurrent=2, rand_sample=2),
            metric="loss",
            mode="min",
            num_samples=4,
        ),
        run_config=tune.RunConfig(name="hebo", storage_path=str(tmp_path), verbose=0),
    )
    try:
        grid = tuner.fit()
    finally:
        popflow.init()
    assert not grid.errors and len(grid) == 4
    assert len({r.config["x"] for r in grid}) == 4
    assert all(r.config["steps"] == 2 and r.metrics["training_iteration"] == 2 for r in grid)
