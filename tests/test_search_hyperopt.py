"""Ray's ``HyperOptSearch`` over the real HyperOpt: popflow's spaces converted (and what
HyperOpt cannot sample named), HyperOpt's own conditional spaces, points first, TPE
learning, and a seeded run reproduced, also by a resume's replay of its committed calls."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hyperopt import Domain, hp
from hyperopt.pyll import stochastic
from support.searchers import SPACE, configs, replayed_suggestions, simulate

from popflow import ASHAScheduler, choice, grid_search, uniform
from popflow import tune as ray_tune
from popflow.flows.integrations.hyperopt_search import convert_search_space
from popflow.tune.search import ConcurrencyLimiter
from popflow.tune.search.hyperopt import HyperOptSearch

pytestmark = pytest.mark.unit

#: Ray's hyperopt_conditional_search_space_example's space: "mult" only with "relu"
CONDITIONAL = {
    "activation": hp.choice(
        "activation",
        [{"activation": "relu", "mult": hp.uniform("mult", 1, 2)}, {"activation": "tanh"}],
    ),
    "width": hp.uniform("width", 0, 20),
    "steps": 100,
}


def drive(searcher: HyperOptSearch, n: int, loss: Any) -> list[dict[str, Any]]:
    """``n`` trials one after another, each told ``loss(config)`` as its ``"loss"``."""
    out = []
    for i in range(n):
        config = searcher.suggest(f"t{i}")
        searcher.on_trial_result(f"t{i}", {"loss": loss(config), "training_iteration": 1})
        searcher.on_trial_complete(f"t{i}", {"loss": loss(config)})
        out.append(config)
    return out


# -- the space ------------------------------------------------------------------------
def test_converts_every_search_space_it_can_and_names_what_it_cannot():
    space = {
        "a": uniform(0, 1),
        "b": {"c": ray_tune.loguniform(1e-4, 1e-1), "k": "kept by param_space"},
        "d": ray_tune.randint(1, 5),
        "e": choice(["x", {"y": ray_tune.quniform(0, 1, 0.25)}]),
        "f": ray_tune.qrandint(0, 10, 2),
        "g": ray_tune.lograndint(1, 100),
        "h": ray_tune.randn(2, 0.5),
        "i": ray_tune.qloguniform(1, 100, 1),
        "j": 7,
    }
    converted = convert_search_space(space)
    labels = {label: node.name for label, node in Domain(lambda c: c, converted).params.items()}
    assert labels == {
        "a": "uniform",
        "b/c": "loguniform",
        "d": "quniform",
        "e": "randint",  # a choice's index
        "e/1/y": "quniform",  # in the category it belongs to
        "f": "quniform",
        "g": "qloguniform",
        "h": "normal",
        "i": "qloguniform",
    }
    rng = np.random.default_rng(0)
    samples = [stochastic.sample(converted, rng) for _ in range(300)]
    assert all(set(s) == set(space) - {"j"} and set(s["b"]) == {"c"} for s in samples)
    assert all(0 <= s["a"] <= 1 and 1e-4 <= s["b"]["c"] <= 1e-1 for s in samples)
    assert {s["d"] for s in samples} == {1, 2, 3, 4}  # Ray's randint excludes its upper
    assert {s["f"] for s in samples} == {0, 2, 4, 6, 8, 10}  # qrandint's upper is included
    assert all(1 <= s["g"] <= 99 and isinstance(s["g"], int) for s in samples)
    assert {s["e"] if s["e"] == "x" else "y" for s in samples} == {"x", "y"}
    assert all(s["e"]["y"] in (0, 0.25, 0.5, 0.75, 1) for s in samples if s["e"] != "x")
    with pytest.raises(ValueError, match="`a` is a grid_search, which HyperOpt cannot sample"):
        convert_search_space({"a": grid_search([1, 2])})
    with pytest.raises(ValueError, match="HyperOpt cannot sample `n` \\(SampleFrom\\)"):
        convert_search_space({"n": ray_tune.sample_from(lambda spec: 1)})
    with pytest.raises(ValueError, match="a single value is a constant"):
        convert_search_space({"n": ray_tune.randint(3, 4)})


def test_a_conditional_hyperopt_space_gives_nested_configs_of_the_branch_chosen():
    searcher = HyperOptSearch(
        CONDITIONAL, metric="loss", mode="min", n_initial_points=5, random_state_seed=0
    )
    out = drive(searcher, 12, lambda c: c["width"])
    assert {c["activation"]["activation"] for c in out} == {"relu", "tanh"}
    for config in out:
        assert set(config) == {"activation", "width", "steps"} and config["steps"] == 100
        relu = config["activation"]["activation"] == "relu"
        assert ("mult" in config["activation"]) == relu
        assert not relu or 1 <= config["activation"]["mult"] <= 2


def test_popflow_choices_of_dicts_branch_too_with_the_same_names_in_each(tmp_path):
    space = {
        "opt": choice(
            [{"name": "sgd", "lr": uniform(0, 1)}, {"name": "adam", "lr": uniform(2, 3)}]
        ),
        "lr": uniform(0, 1),
    }
    sim = simulate(tmp_path, HyperOptSearch(n_initial_points=3), param_space=space, num_samples=8)
    got = configs(sim)
    assert {c["opt"]["name"] for c in got} == {"sgd", "adam"}
    for config in got:
        low = 0 if config["opt"]["name"] == "sgd" else 2
        assert low <= config["opt"]["lr"] <= low + 1 and 0 <= config["lr"] <= 1


def test_points_to_evaluate_come_first_in_order(tmp_path):
    points = [
        {"activation": "tanh", "width": 3.0},
        {"activation": {"activation": "tanh"}, "width": 5.0},  # the category's value itself
        {"activation": "relu", "mult": 1.5, "width": 7.0},
    ]
    # a plain category is given by its value (Ray's rule): here, the choice of dicts
    # takes the branch's dict; a string category below takes the string
    with pytest.raises(ValueError, match="not one of its constant categories"):
        HyperOptSearch(CONDITIONAL, points_to_evaluate=points[:1])
    with pytest.raises(ValueError, match="lacks a value the space needs"):
        HyperOptSearch(CONDITIONAL, points_to_evaluate=[{"activation": {"activation": "tanh"}}])
    searcher = HyperOptSearch(
        CONDITIONAL, metric="loss", mode="min", points_to_evaluate=points[1:2], random_state_seed=1
    )
    first, *rest = drive(searcher, 4, lambda c: c["width"])
    assert first == {"activation": {"activation": "tanh"}, "width": 5.0, "steps": 100}
    assert all(c != first for c in rest)

    space = {"lr": uniform(0, 1), "opt": choice(["sgd", "adam"])}
    given = [{"lr": 0.25, "opt": "adam"}, {"lr": 0.75, "opt": "sgd"}]
    sim = simulate(tmp_path, HyperOptSearch(points_to_evaluate=given), param_space=space)
    assert configs(sim)[:2] == given


def test_tpe_learns_toward_the_best_region():
    """The loss is least at x = 0.3: after its 10 random trials, TPE suggests nearer it."""
    searcher = HyperOptSearch(metric="loss", mode="min", n_initial_points=10)
    searcher.set_search_properties(None, None, {"x": uniform(0, 1)}, seed=5)
    xs = [c["x"] for c in drive(searcher, 40, lambda c: (c["x"] - 0.3) ** 2)]
    distance = [np.mean([abs(x - 0.3) for x in part]) for part in (xs[:10], xs[20:])]
    assert distance[1] < 0.7 * distance[0], distance


def test_a_max_metric_is_told_negated_and_a_failed_trial_is_not_learnt_from():
    searcher = HyperOptSearch(metric="score", mode="max", random_state_seed=0)
    searcher.set_search_properties(None, None, SPACE)
    for i in range(3):
        searcher.suggest(f"t{i}")
    searcher.on_trial_complete("t0", {"score": 2.0})
    searcher.on_trial_complete("t1", error=True)
    searcher.on_trial_complete("t2", {"other": 1.0})
    docs = {d["tid"]: d for d in searcher._trials.trials}
    assert docs[0]["result"] == {"loss": -2.0, "status": "ok"}
    assert 1 not in docs and docs[2]["result"]["status"] == "fail"


# -- through the driver ---------------------------------------------------------------
def test_a_seeded_run_with_asha_is_reproducible_from_the_run_seed(tmp_path):
    def once(where: str, seed: int) -> list[dict[str, Any]]:
        searcher = ConcurrencyLimiter(HyperOptSearch(n_initial_points=4), max_concurrent=2)
        scheduler = ASHAScheduler(max_t=4, grace_period=1, reduction_factor=2)
        sim = simulate(tmp_path / where, searcher, scheduler=scheduler, num_samples=10, seed=seed)
        assert sim.iterations < 10 * 4  # ASHA stopped some
        return configs(sim)

    first = once("a", 3)
    assert len(first) == 10 and all(0 <= c["lr"] <= 1 for c in first)
    assert once("b", 3) == first
    assert once("c", 4) != first


def test_a_resume_replays_the_committed_calls_into_the_same_suggestions(tmp_path):
    """What a killed and resumed run does: a fresh searcher, set up as the driver sets it
    up, told the committed calls again, suggests every committed config again."""
    space = {"lr": uniform(0, 1), "opt": choice(["sgd", "adam"]), "layers": 2}
    searcher = ConcurrencyLimiter(HyperOptSearch(n_initial_points=3), max_concurrent=2)
    scheduler = ASHAScheduler(max_t=4, grace_period=1, reduction_factor=2)
    made, again = replayed_suggestions(
        searcher, tmp_path, scheduler=scheduler, param_space=space, num_samples=8, seed=11
    )
    assert len(made) == 8 and again == made


@pytest.mark.parametrize(
    ("search_alg", "kwargs", "match"),
    [
        (  # a searcher with its own space, and search spaces in param_space too
            lambda: HyperOptSearch({"lr": hp.uniform("lr", 0, 1)}),
            {},
            "already given a search space",
        ),
        (lambda: HyperOptSearch(metric="loss"), {}, "`metric` is 'score' for the run but 'loss'"),
        (lambda: HyperOptSearch(mode="min"), {}, "`mode` is 'max' for the run but 'min'"),
        (lambda: HyperOptSearch(), {"metric": None, "mode": None}, "no metric"),
        (lambda: HyperOptSearch(metric="score"), {"metric": None, "mode": None}, "no mode"),
        (lambda: HyperOptSearch(), {"param_space": {"lr": grid_search([0.1, 0.2])}}, "grid_search"),
        (
            lambda: HyperOptSearch(),
            {"param_space": {"lr": ray_tune.sample_from(lambda spec: 0.1)}},
            "HyperOpt cannot sample `lr`",
        ),
        (lambda: HyperOptSearch(mode="best"), {}, "`mode` is 'best'"),
    ],
)
def test_bad_search_input_is_refused_before_anything_runs(tmp_path, search_alg, kwargs, match):
    with pytest.raises(ValueError, match=match):
        simulate(tmp_path, search_alg(), **kwargs)
    assert not (tmp_path / "simulation").exists()
