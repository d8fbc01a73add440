"""Ray's ``AxSearch`` over the real Ax (``popflow[ax]``): popflow's spaces as Ax's
parameters (and what Ax cannot search named), a small ``Tuner.fit``, the resume property
(replaying the committed calls gives back every suggestion), bad input refused. Ax's
first import takes tens of seconds (torch, BoTorch), so every test stays in Ax's quick
Sobol phase (its first 5 trials): BoTorch's model fits take tens of seconds each on a
small machine. HEBOSearch's tests are in tests/test_search_hebo.py."""

from __future__ import annotations

import logging
import sys
from typing import Any

import pytest
from ax.adapter.registry import Generators
from ax.generation_strategy.generation_strategy import GenerationStep, GenerationStrategy
from ax.service.ax_client import AxClient, ObjectiveProperties
from support.driving import drive, read_experiment
from support.searchers import configs, replayed_suggestions, simulate

import popflow
from popflow import tune
from popflow.tune.search import ConcurrencyLimiter, Searcher, create_searcher
from popflow.tune.search.ax import AxSearch, convert_search_space

PARAMS = [{"name": "lr", "type": "range", "bounds": [0.0, 1.0], "value_type": "float"}]


def ax_search(**kwargs: Any) -> Searcher:
    return ConcurrencyLimiter(AxSearch(**kwargs), 2)


# -- the space -----------------------------------------------------------------------
@pytest.mark.unit
def test_converts_the_spaces_ax_can_search_and_names_the_rest(caplog):
    with caplog.at_level(logging.WARNING):
        params = convert_search_space(
            {
                "lr": tune.loguniform(1e-4, 1e-1),
                "net": {"width": tune.randint(2, 9), "act": tune.choice(["relu", "tanh"])},
                "mom": tune.quniform(0, 1, 0.1),
                "units": tune.qrandint(8, 64, 8),
                "heads": tune.lograndint(1, 17),
                "steps": 100,
                "tag": "kept",
                "layers": [1, 2],  # not a value Ax holds: left to the run's param_space
            }
        )
    assert params == [
        {"name": "steps", "type": "fixed", "value": 100},
        {"name": "tag", "type": "fixed", "value": "kept"},
        {"name": "lr", "type": "range", "bounds": [1e-4, 1e-1], "value_type": "float", "log_scale": True},
        {"name": "net/width", "type": "range", "bounds": [2, 8], "value_type": "int", "log_scale": False},
        {"name": "net/act", "type": "choice", "values": ["relu", "tanh"]},
        {"name": "mom", "type": "range", "bounds": [0, 1], "value_type": "float", "log_scale": False},
        {"name": "units", "type": "range", "bounds": [8, 64], "value_type": "int", "log_scale": False},
        {"name": "heads", "type": "range", "bounds": [1, 16], "value_type": "int", "log_scale": True},
    ]  # fmt: skip
    assert "does not support quantization" in caplog.text
    for space, match in [
        ({"a": tune.grid_search([1, 2])}, "grid_search"),
        ({"a": tune.randn(0, 1)}, "Normal"),
        ({"a": tune.sample_from(lambda _: 1)}, "SampleFrom"),
        ({"a": tune.choice([[1], [2]])}, "strings, numbers or bools"),
        ({"a": tune.randint(3, 4)}, "single value"),
    ]:
        with pytest.raises(ValueError, match=match):
            convert_search_space(space)


@pytest.mark.unit
def test_a_nested_space_is_suggested_nested_with_its_constants():
    searcher = AxSearch()
    space = {"net": {"width": tune.randint(2, 9), "depth": 3}, "lr": tune.uniform(0, 1)}
    assert searcher.set_search_properties("loss", "min", space, seed=1)
    config = searcher.suggest("t0")
    assert set(config) == {"net", "lr"} and config["net"]["depth"] == 3
    assert 2 <= config["net"]["width"] <= 8 and isinstance(config["net"]["width"], int)


# -- Ray's rules ---------------------------------------------------------------------
@pytest.mark.unit
def test_points_come_first_then_ax_waits_for_data_after_its_sobol_phase():
    searcher = AxSearch(
        space=[*PARAMS, {"name": "k", "type": "fixed", "value": 3}],
        metric="loss",
        mode="min",
        points_to_evaluate=[{"lr": 0.25}],
    )
    searcher.set_search_properties(None, None, {}, seed=0)
    assert searcher.suggest("p") == {"lr": 0.25, "k": 3}  # the fixed value filled in
    suggested = [searcher.suggest(f"t{i}") for i in range(5)]
    # Ax's Sobol phase holds 5 trials awaiting data, the point attached among them: then
    # not now (None), until results come
    assert all(0 <= c["lr"] <= 1 for c in suggested[:4]) and suggested[4] is None
    searcher.on_trial_complete("p", {"loss": float("nan")})  # abandoned, as Ray
    searcher.on_trial_complete("t0", {"loss": 0.5}, error=True)  # logged as failed
    searcher.on_trial_complete("t1", {"loss": 0.4})
    statuses = {t.index: t.status.name for t in searcher._ax.experiment.trials.values()}
    assert [statuses[i] for i in range(3)] == ["ABANDONED", "FAILED", "COMPLETED"]
    data = searcher._ax.experiment.fetch_data().df
    assert list(data["metric_name"]) == ["loss"] and list(data["mean"]) == [0.4]


@pytest.mark.unit
def test_a_max_metric_is_an_ax_objective_to_maximise_and_a_client_of_your_own_is_used():
    searcher = AxSearch(mode="max")
    searcher.set_search_properties(None, None, {"x": tune.uniform(0, 1)}, seed=0)
    objective = searcher._ax.experiment.optimization_config.objective
    assert (objective.metric_names, objective.minimize) == (["_metric"], False)

    client = AxClient(random_seed=5, verbose_logging=False)
    client.create_experiment(
        parameters=PARAMS, objectives={"score": ObjectiveProperties(minimize=True)}
    )
    own = AxSearch(ax_client=client)
    assert (own.metric, own.mode) == ("score", "min")  # read from the experiment
    assert not own.set_search_properties("score", "min", {}, seed=0)
    assert 0 <= own.suggest("t0")["lr"] <= 1


@pytest.mark.unit
@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: AxSearch(mode="best"), ValueError, "mode"),
        (lambda: AxSearch(points_to_evaluate={"x": 1}), ValueError, "list of points"),
        (lambda: AxSearch(space=3), TypeError, "space"),
        (lambda: AxSearch(space={"x": 1.0}), TypeError, "popflow search spaces"),
        (lambda: AxSearch(parameter_constraints="x <= 1"), ValueError, "list of strings"),
        (lambda: AxSearch(ax_client=AxClient()), ValueError, "create an Ax experiment"),
        (lambda: AxSearch(space=PARAMS).suggest("t0"), ValueError, "mode"),
        (lambda: AxSearch().suggest("t0"), RuntimeError, "no search space"),
    ],
)
def test_bad_ax_arguments_are_named(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.unit
def test_without_the_extra_the_error_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ax", None)  # `import ax` fails as if not installed
    with pytest.raises(ImportError, match=r"AxSearch needs ax: pip install 'popflow\[ax\]'"):
        AxSearch()


@pytest.mark.unit
def test_an_experiment_of_your_own_beside_searcher_arguments_is_refused():
    client = AxClient(verbose_logging=False)
    client.create_experiment(
        parameters=PARAMS, objectives={"y": ObjectiveProperties(minimize=True)}
    )
    with pytest.raises(ValueError, match="do not pass values"):
        AxSearch(ax_client=client, metric="y")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("search_alg", "kwargs", "match"),
    [
        (lambda: AxSearch(space=PARAMS), {}, "already given a search space"),
        (lambda: AxSearch(), {"param_space": {"lr": tune.randn(0, 1)}}, "AxSearch"),
        (lambda: AxSearch(mode="min"), {}, "`mode` is 'max' for the run but 'min'"),
        (
            lambda: AxSearch(parameter_constraints=["lr >= nothing"]),
            {},
            "nothing",
        ),
    ],
)
def test_bad_search_input_is_refused_before_anything_runs(tmp_path, search_alg, kwargs, match):
    with pytest.raises(ValueError, match=match):
        simulate(tmp_path, search_alg(), **kwargs)
    assert not (tmp_path / "simulation").exists()


# -- the resume property, and seeds ----------------------------------------------------
@pytest.mark.unit
def test_replaying_the_committed_calls_gives_back_every_suggestion(tmp_path):
    """Two points attached, then Sobol's trials, two at a time: a resume's replay makes the
    same Ax experiment and goes on as an uninterrupted run would."""
    searcher = ax_search(points_to_evaluate=[{"lr": 0.1}, {"lr": 0.9}])
    made, again = replayed_suggestions(
        searcher, tmp_path, num_samples=6, scheduler=popflow.ASHAScheduler(max_t=4)
    )
    assert len(made) == 6 and again == made
    assert [m["lr"] for m in made[:2]] == [0.1, 0.9]


@pytest.mark.unit
def test_a_replay_gives_back_every_suggestion_across_ax_waiting_for_data(tmp_path):
    """No limiter: Ax gives 3 Sobol trials, then None (DataRequiredError) until their
    results came, then Sobol again (quick, unlike BoTorch). The asks that got None are not
    committed; a replay without them still gives back every suggestion."""
    strategy = GenerationStrategy(
        nodes=[
            GenerationStep(generator=Generators.SOBOL, num_trials=3, min_trials_observed=3),
            GenerationStep(generator=Generators.SOBOL, num_trials=-1),
        ]
    )
    made, again = replayed_suggestions(
        AxSearch(generation_strategy=strategy), tmp_path, num_samples=6
    )
    assert len(made) == 6 and again == made


@pytest.mark.unit
def test_a_run_is_reproducible_from_its_seed_unless_ax_is_given_one(tmp_path):
    def once(where: str, seed: int, **kwargs: Any) -> list[dict[str, Any]]:
        return configs(simulate(tmp_path / where, ax_search(**kwargs), num_samples=4, seed=seed))

    first = once("a", 1)
    assert once("b", 1) == first and once("c", 2) != first
    assert len({c["lr"] for c in first}) == 4
    assert once("d", 1, random_seed=7) == once("e", 2, random_seed=7)


@pytest.mark.system
def test_a_synchronous_run_with_ax_killed_twice_ends_identical(prefect_server, tmp_path):
    """tests/crash_driver.py ``--search ax`` (seeded by the run, Sobol steps, two trials
    live): SIGKILLed twice and resumed, the run ends as one never interrupted, down to
    every suggested config."""
    extra = ["--search", "ax", "--num-samples", "10", "--iterations", "8"]
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
def test_a_tuner_fit_with_ax_search(prefect_server, dask_cluster, tmp_path):
    popflow.init(dask_cluster)
    tuner = tune.Tuner(
        train,
        param_space={"x": tune.uniform(0, 1), "n": tune.randint(0, 3), "steps": 2},
        tune_config=tune.TuneConfig(
            search_alg=ConcurrencyLimiter(AxSearch(), 2),
            metric="loss",
            mode="min",
            num_samples=4,
        ),
        run_config=tune.RunConfig(name="ax", storage_path=str(tmp_path), verbose=0),
    )
    try:
        grid = tuner.fit()
    finally:
        popflow.init()
    assert not grid.errors and len(grid) == 4
    assert len({r.config["x"] for r in grid}) == 4
    assert all(r.config["steps"] == 2 and r.metrics["training_iteration"] == 2 for r in grid)


@pytest.mark.unit
def test_create_searcher_makes_them_by_rays_names():
    searcher = create_searcher("Ax", metric="loss", mode="min", num_samples=3)  # not Ax's
    assert isinstance(searcher, AxSearch) and (searcher.metric, searcher.mode) == ("loss", "min")
    with pytest.raises(ValueError, match="must be one of"):
        create_searcher("zoopt")
