"""Ray's ``NevergradSearch`` and ``BayesOptSearch`` over the real libraries: their spaces,
their own rules (Nevergrad's ask/tell; BayesOpt's random phase, duplicates and patience),
bad input named before anything runs, and the resume property (replaying the committed
calls gives back every suggestion) through the real driver on the simulated backend."""

from __future__ import annotations

import logging
from typing import Any

import nevergrad as ng
import pytest
from support.searchers import configs, replayed_suggestions, simulate

from popflow import ASHAScheduler, choice, grid_search, loguniform, randint, randn, uniform
from popflow.flows.integrations import bayesopt_search, nevergrad_search
from popflow.tune.search import ConcurrencyLimiter, Searcher
from popflow.tune.search.bayesopt import BayesOptSearch
from popflow.tune.search.nevergrad import NevergradSearch

pytestmark = pytest.mark.unit

ASHA = {"max_t": 4, "grace_period": 1, "reduction_factor": 2}


def nevergrad() -> Searcher:
    return ConcurrencyLimiter(NevergradSearch(optimizer=ng.optimizers.OnePlusOne), 2)


def bayesopt(**kwargs: Any) -> Searcher:
    return ConcurrencyLimiter(BayesOptSearch(random_state=None, **kwargs), 2)


# -- the resume property, and seeds -----------------------------------------------------
@pytest.mark.parametrize(
    "make", [nevergrad, lambda: bayesopt(random_search_steps=4)], ids=["nevergrad", "bayesopt"]
)
def test_replaying_the_committed_calls_gives_back_every_suggestion(tmp_path, make):
    scheduler = ASHAScheduler(**ASHA)
    made, again = replayed_suggestions(make(), tmp_path, scheduler=scheduler, num_samples=12)
    assert len(made) == 12 and again == made


@pytest.mark.parametrize(
    "make", [nevergrad, lambda: bayesopt(random_search_steps=2)], ids=["nevergrad", "bayesopt"]
)
def test_a_run_is_reproducible_from_its_seed(tmp_path, make):
    def once(where: str, seed: int) -> list[dict[str, Any]]:
        sim = simulate(tmp_path / where, make(), num_samples=8, seed=seed)
        return configs(sim)

    first = once("a", 1)
    assert once("b", 1) == first
    assert once("c", 2) != first
    assert len({c["lr"] for c in first}) == 8


def test_bayesopt_search_keeps_rays_fixed_default_seed(tmp_path):
    """``random_state=42`` by default, as Ray: the run's seed does not change its random
    phase (the process that follows hears other results: Drifting's noise is seeded too)."""
    a = configs(simulate(tmp_path / "a", BayesOptSearch(random_search_steps=3), seed=1))
    b = configs(simulate(tmp_path / "b", BayesOptSearch(random_search_steps=3), seed=2))
    assert a[:3] == b[:3] and a != b


# -- Nevergrad ----------------------------------------------------------------------------
def test_nevergrad_converts_the_spaces_it_can_and_names_what_it_cannot():
    space = nevergrad_search.convert_search_space(
        {
            "lr": loguniform(1e-4, 1e-1),
            "net": {"width": randint(2, 9), "act": choice(["relu", "tanh"])},
            "mom": uniform(0, 1),
            "noise": randn(0, 2),
            "fixed": 3,
        }
    )
    assert sorted(space.value) == ["lr", "mom", "net/act", "net/width", "noise"]
    width = space["net/width"]
    assert (width.bounds[0][0], width.bounds[1][0]) == (2, 8)  # randint's upper excluded
    with pytest.raises(ValueError, match="grid_search"):
        nevergrad_search.convert_search_space({"a": grid_search([1, 2])})
    with pytest.raises(ValueError, match="single value"):
        nevergrad_search.convert_search_space({"a": randint(3, 4)})


def test_nevergrad_asks_the_points_first_and_nests_slashed_names():
    searcher = NevergradSearch(
        optimizer=ng.optimizers.OnePlusOne,
        space=ng.p.Dict(
            **{"lr": ng.p.Log(lower=1e-4, upper=1.0), "net/width": ng.p.Scalar(lower=1, upper=9)}
        ),
        metric="loss",
        mode="min",
        points_to_evaluate=[{"lr": 0.01, "net": {"width": 3.0}}, {"lr": 0.5, "net/width": 7.0}],
    )
    assert searcher.suggest("t0") == {"lr": 0.01, "net": {"width": 3.0}}
    assert searcher.suggest("t1") == {"lr": 0.5, "net": {"width": 7.0}}
    third = searcher.suggest("t2")
    assert set(third) == {"lr", "net"} and 1 <= third["net"]["width"] <= 9


def test_nevergrad_is_told_a_max_metric_negated():
    searcher = NevergradSearch(
        optimizer=ng.optimizers.RandomSearch,
        space=ng.p.Dict(x=ng.p.Scalar(lower=0, upper=1)),
        metric="score",
        mode="max",
    )
    searcher.set_search_properties(None, None, {}, seed=0)
    for i, score in enumerate([1.0, 5.0, 3.0]):
        searcher.suggest(f"t{i}")
        searcher.on_trial_complete(f"t{i}", {"score": score})
    searcher.on_trial_complete("gone", {"score": 9.0})  # never suggested: nothing told
    losses = sorted(c.mean for c in searcher.nevergrad_optimizer.archive.values())
    assert losses == [-5.0, -3.0, -1.0]


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: NevergradSearch(optimizer="OnePlusOne"), ValueError, "optimizer"),
        (
            lambda: NevergradSearch(
                optimizer=ng.optimizers.OnePlusOne(ng.p.Scalar(), budget=4),
                space=ng.p.Dict(x=ng.p.Scalar()),
            ),
            ValueError,
            "already made",
        ),
        (lambda: NevergradSearch(ng.optimizers.OnePlusOne, space=3), TypeError, "space"),
        (lambda: NevergradSearch(ng.optimizers.OnePlusOne, mode="best"), ValueError, "mode"),
        (
            lambda: NevergradSearch(ng.optimizers.OnePlusOne, points_to_evaluate={"x": 1}),
            ValueError,
            "list of points",
        ),
    ],
)
def test_bad_nevergrad_arguments_are_named(make, error, match):
    with pytest.raises(error, match=match):
        make()


# -- BayesOpt -----------------------------------------------------------------------------
def test_bayesopt_converts_floats_and_refuses_the_rest(caplog):
    with caplog.at_level(logging.WARNING):
        bounds = bayesopt_search.convert_search_space(
            {"lr": loguniform(1e-4, 1e-1), "net": {"drop": uniform(0, 0.5)}, "fixed": 3}
        )
    assert bounds == {"lr": (1e-4, 1e-1), "net/drop": (0, 0.5)}
    assert "not on a log scale" in caplog.text
    for domain in (randint(1, 4), choice([1, 2]), grid_search([1, 2])):
        with pytest.raises(ValueError, match="BayesOpt"):
            bayesopt_search.convert_search_space({"a": domain})


def test_bayesopt_waits_for_its_random_phase_then_follows_the_process():
    searcher = BayesOptSearch({"x": (0.0, 1.0)}, metric="y", mode="max", random_search_steps=3)
    first = [searcher.suggest(f"t{i}") for i in range(3)]
    assert all(0 <= c["x"] <= 1 for c in first)
    assert searcher.suggest("t3") is None  # the random configs' results are not in yet
    for i, c in enumerate(first):
        searcher.on_trial_complete(f"t{i}", {"y": -((c["x"] - 0.7) ** 2)})
    assert len(searcher.optimizer.space) == 3  # told together, once the phase ended
    assert 0 <= searcher.suggest("t3")["x"] <= 1


def test_bayesopt_ends_the_search_once_a_config_comes_up_more_than_patience_times():
    searcher = BayesOptSearch(
        {"x": (0.0, 1.0)},
        metric="y",
        mode="max",
        random_search_steps=0,
        points_to_evaluate=[{"x": 0.5}] * 3,
        patience=2,
    )
    assert searcher.suggest("t0") == {"x": 0.5}
    searcher.on_trial_complete("t0", {"y": 1.0})
    assert searcher.suggest("t1") == Searcher.FINISHED


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: BayesOptSearch(patience=0), ValueError, "patience"),
        (lambda: BayesOptSearch(random_search_steps=-1), ValueError, "random_search_steps"),
        (lambda: BayesOptSearch({"x": (1.0, 0.0)}), ValueError, "lower < upper"),
        (lambda: BayesOptSearch(random_state="seed"), TypeError, "random_state"),
        (lambda: BayesOptSearch(utility_kwargs={"kind": "best"}), Exception, "best"),
        (lambda: BayesOptSearch(mode="best"), ValueError, "mode"),
    ],
)
def test_bad_bayesopt_arguments_are_named(make, error, match):
    with pytest.raises(error, match=match):
        make()


# -- through the driver: bad input before anything runs ----------------------------------
@pytest.mark.parametrize(
    ("search_alg", "kwargs", "match"),
    [
        (
            lambda: NevergradSearch(
                ng.optimizers.OnePlusOne, space={"lr": ng.p.Scalar(lower=0, upper=1)}
            ),
            {},
            "already given a search space",
        ),
        (lambda: BayesOptSearch({"lr": (0.0, 1.0)}), {}, "already given a search space"),
        (lambda: NevergradSearch(ng.optimizers.OnePlusOne, metric="loss"), {}, "`metric`"),
        (lambda: BayesOptSearch(mode="min"), {}, "`mode` is 'max' for the run but 'min'"),
        (lambda: BayesOptSearch(), {"param_space": {"lr": choice([0.1, 0.2])}}, "BayesOpt"),
    ],
)
def test_bad_search_input_is_refused_before_anything_runs(tmp_path, search_alg, kwargs, match):
    with pytest.raises(ValueError, match=match):
        simulate(tmp_path, search_alg(), **kwargs)
    assert not (tmp_path / "simulation").exists()
