"""Ray's ``TuneBOHB`` (BOHB's KDE model, in numpy/scipy) and ``HyperBandForBOHB``: the model
finds the good region, the spaces it converts and those it names, the bracket that waits to
be filled, bad input named before anything runs, and the resume property (replaying the
committed calls gives back every suggestion) through the real driver on the simulated
backend."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from support.searchers import committed, configs, replayed_suggestions, simulate

from popflow import (
    HyperBandScheduler,
    choice,
    grid_search,
    lograndint,
    loguniform,
    qloguniform,
    qrandint,
    quniform,
    randint,
    randn,
    sample_from,
    uniform,
)
from popflow.schedulers import Trial
from popflow.schedulers.search import bohb
from popflow.schedulers.search_space import flat_keys
from popflow.schedulers.trial import TrialStatus
from popflow.schedulers.trial_scheduler import Action, Decision
from popflow.tune.schedulers import HyperBandForBOHB as Exported
from popflow.tune.schedulers.hb_bohb import HyperBandForBOHB
from popflow.tune.search import ConcurrencyLimiter, Searcher
from popflow.tune.search.bohb import TuneBOHB

pytestmark = pytest.mark.unit

SPACE = {"x": uniform(0.0, 1.0), "c": choice(["a", "b", "c"])}


def objective(config: dict[str, Any]) -> float:
    """Best at x = 0.7 and c = "b"."""
    return -((config["x"] - 0.7) ** 2) + (0.1 if config["c"] == "b" else 0.0)


def tell(searcher: Searcher, trial_id: str, result: dict[str, Any]) -> None:
    searcher.on_trial_result(trial_id, result)
    searcher.on_trial_complete(trial_id, result)


def search(searcher: TuneBOHB, n: int) -> list[dict[str, Any]]:
    """``n`` trials of one iteration each, suggested and told one after the other."""
    searcher.set_search_properties(None, None, {}, seed=0)
    out = []
    for i in range(n):
        config = searcher.suggest(f"t{i}")
        tell(searcher, f"t{i}", {"training_iteration": 1, "y": objective(config)})
        out.append(config)
    return out


# -- the model ------------------------------------------------------------------------------
def test_the_model_prefers_the_good_region():
    def share_near_the_best(bohb_config: dict[str, Any]) -> tuple[float, float]:
        late = search(TuneBOHB(SPACE, bohb_config, "y", "max", seed=0), 90)[30:]
        near = np.mean([abs(c["x"] - 0.7) < 0.1 for c in late])
        return float(near), float(np.mean([c["c"] == "b" for c in late]))

    near, b = share_near_the_best({})
    # the prior alone (every config random): about 20% near 0.7 and a third "b"
    near_random, b_random = share_near_the_best({"random_fraction": 1.0})
    assert near > 0.6 and b > 0.6
    assert near_random < 0.35 and b_random < 0.45


def test_a_budget_gets_its_model_once_good_and_bad_each_have_more_points_than_dimensions():
    model = bohb.BOHBModel({"x": uniform(0, 1)})  # one dimension: min_points_in_model 2
    assert model.min_points_in_model == 2
    for i, loss in enumerate([3.0, 1.0, 2.0]):
        model.new_result(np.array([i / 4]), loss, budget=1.0)
    assert model.model_budget is None  # 3 points: 2 good, 1 bad
    model.new_result(np.array([0.9]), math.nan, budget=1.0)  # NaN: a loss of +inf
    assert model.model_budget == 1.0 and model.losses[1.0][-1] == math.inf
    for x in (0.1, 0.2, 0.3, 0.4):
        model.new_result(np.array([x]), 0.0, budget=3.0)
    assert model.model_budget == 3.0
    model.new_result(np.array([0.5]), 0.0, budget=1.0)  # below the largest model: not kept
    assert len(model.configs[1.0]) == 4


def test_the_budget_is_rays_hyperband_info_where_a_result_has_one_else_its_time_attr():
    searcher = TuneBOHB({"x": uniform(0, 1)}, metric="y", mode="min", seed=1)
    searcher.set_search_properties(None, None, {})
    for i in range(3):
        searcher.suggest(f"t{i}")
    searcher.on_trial_result("t0", {"training_iteration": 2, "y": 1.0})
    searcher.on_trial_result("t1", {"training_iteration": 5, "y": 1.0, "hyperband_info": {}})
    searcher.on_trial_result("t1", {"y": 2.0, "hyperband_info": {"budget": 9}})
    searcher.on_trial_result("t2", {"training_iteration": 3})  # no metric: not told
    searcher.on_trial_result("gone", {"training_iteration": 3, "y": 0.0})  # never suggested
    assert {b: len(c) for b, c in searcher.bohber.configs.items()} == {2.0: 1, 9.0: 1}


def test_max_concurrent_counts_running_trials_and_a_refusal_draws_nothing():
    limited = TuneBOHB(SPACE, metric="y", mode="max", seed=3, max_concurrent=2)
    free = TuneBOHB(SPACE, metric="y", mode="max", seed=3)
    for s in (limited, free):
        s.set_search_properties(None, None, {})
    assert [limited.suggest(t) for t in "ab"] == [free.suggest(t) for t in "ab"]
    assert limited.suggest("c") is None
    limited.on_pause("a")  # Ray's hook: a paused trial is not running
    assert limited.suggest("c") == free.suggest("c")
    assert limited.suggest("d") is None
    limited.on_trial_complete("b")
    assert limited.suggest("d") == free.suggest("d")


def test_points_to_evaluate_come_first_and_are_learnt_from():
    searcher = TuneBOHB(
        {"net": {"width": randint(1, 9)}, "lr": loguniform(1e-4, 1e-1)},
        metric="loss",
        mode="min",
        points_to_evaluate=[{"net": {"width": 3}, "lr": 0.01}, {"net/width": 8, "lr": 1e-4}],
    )
    searcher.set_search_properties(None, None, {}, seed=0)
    assert searcher.suggest("t0") == {"net": {"width": 3}, "lr": 0.01}
    assert searcher.suggest("t1") == {"net": {"width": 8}, "lr": 1e-4}
    tell(searcher, "t0", {"training_iteration": 1, "loss": 0.5})
    assert searcher.bohber.configs[1.0][0].tolist() == pytest.approx([0.3125, 2 / 3])
    third = searcher.suggest("t2")
    assert set(third) == {"net", "lr"} and 1 <= third["net"]["width"] <= 8


# -- spaces -----------------------------------------------------------------------------------
def test_every_domain_is_sampled_inside_its_bounds():
    space = {
        "u": uniform(-1, 1),
        "q": quniform(0, 1, 0.25),
        "lu": loguniform(1e-4, 1e-1),
        "qlu": qloguniform(1, 100, 5),
        "n": randn(5, 2),
        "i": randint(2, 5),
        "qi": qrandint(3, 17, 4),
        "li": lograndint(1, 100),
        "net": {"act": choice(["relu", "tanh"]), "depth": 3},
    }
    converted = bohb.convert_search_space(space)
    assert sorted(converted) == ["i", "li", "lu", "n", "net/act", "q", "qi", "qlu", "u"]
    searcher = TuneBOHB(space, metric="y", mode="max", seed=0)
    searcher.set_search_properties(None, None, {})
    seen = [searcher.suggest(f"t{i}") for i in range(200)]
    for c in seen:
        assert -1 <= c["u"] <= 1 and c["q"] in (0, 0.25, 0.5, 0.75, 1.0)
        assert 1e-4 <= c["lu"] <= 1e-1 and c["qlu"] % 5 == 0 and 5 <= c["qlu"] <= 100
        assert isinstance(c["n"], float) and set(c["net"]) == {"act"}
        assert type(c["i"]) is int and 2 <= c["i"] <= 4
        assert type(c["qi"]) is int and c["qi"] in (4, 8, 12, 16)
        assert type(c["li"]) is int and 1 <= c["li"] <= 99
    assert {c["i"] for c in seen} == {2, 3, 4} and {c["net"]["act"] for c in seen} == {
        "relu",
        "tanh",
    }
    # each value's coordinate gives the value back
    model = bohb.BOHBModel(converted)
    flat = {k: v for k, v in flat_keys(seen[0]).items()}
    assert model.config(model.vector(flat)) == pytest.approx(flat)


def test_what_bohb_cannot_sample_is_named():
    with pytest.raises(ValueError, match="grid_search"):
        bohb.convert_search_space({"a": grid_search([1, 2])})
    with pytest.raises(ValueError, match="SampleFrom"):
        bohb.convert_search_space({"a": {"b": sample_from(lambda _: 1)}})

    class ConfigurationSpace:  # what ConfigSpace's looks like to TuneBOHB
        __module__ = "ConfigSpace.configuration_space"

    with pytest.raises(TypeError, match="param_space"):
        TuneBOHB(ConfigurationSpace())


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: TuneBOHB(mode="best"), ValueError, "mode"),
        (lambda: TuneBOHB(mode=["min", "max"]), ValueError, "one objective"),
        (lambda: TuneBOHB(space=[1, 2]), TypeError, "space"),
        (lambda: TuneBOHB(SPACE, bohb_config={"eta": 3}), TypeError, "eta"),
        (lambda: TuneBOHB(SPACE, bohb_config={"num_samples": 0}), ValueError, "num_samples"),
        (lambda: TuneBOHB(SPACE, points_to_evaluate=[{"x": 0.5}]), ValueError, "'c'"),
        (lambda: TuneBOHB(SPACE, points_to_evaluate=[{"x": 0.5, "c": "z"}]), ValueError, "'z'"),
        (lambda: TuneBOHB(seed="0"), TypeError, "seed"),
        (lambda: HyperBandForBOHB(mode="best"), ValueError, "mode"),
        (lambda: HyperBandForBOHB(reduction_factor=1), ValueError, "reduction_factor"),
    ],
)
def test_bad_arguments_are_named(make, error, match):
    with pytest.raises(error, match=match):
        make()


# -- HyperBandForBOHB ------------------------------------------------------------------------
def bracket_of_three(scheduler: HyperBandScheduler) -> tuple[list[Trial], list[Any]]:
    """Three trials of a bracket meant for nine (max_t=9, η=3), each at its first milestone."""
    trials = [Trial(f"t{i}", {}) for i in range(3)]
    for t in trials:
        scheduler.on_trial_add(t)
        t.status = TrialStatus.RUNNING
    assert scheduler.choose_trial_to_run([]) is None
    out = [
        scheduler.on_trial_result(t, {"training_iteration": 1, "y": i})
        for i, t in enumerate(trials)
    ]
    return trials, out


def test_a_bracket_waits_to_be_filled_until_nothing_runs():
    plain = HyperBandScheduler(metric="y", mode="max", max_t=9)
    _, out = bracket_of_three(plain)
    assert isinstance(out[-1], Decision)  # popflow's HyperBand halves the three at once

    hb = HyperBandForBOHB(metric="y", mode="max", max_t=9)
    assert Exported is HyperBandForBOHB
    trials, out = bracket_of_three(hb)
    assert out == [Action.PAUSE] * 3  # Ray's BOHB: paused, room for more trials
    for t in trials:
        t.status = TrialStatus.PAUSED
    hb.on_trial_add(late := Trial("t3", {}))  # a fourth joins the bracket and runs
    assert hb.choose_trial_to_run([*trials, late]) is late
    late.status = TrialStatus.RUNNING
    assert hb.choose_trial_to_run(trials) is None  # t3 runs: the bracket waits
    assert hb.on_trial_result(late, {"training_iteration": 1, "y": -1}) == Action.PAUSE
    late.status = TrialStatus.PAUSED
    # nothing runs and nothing new came: the bracket halves as it is (n_1 = 3 of 4 go on)
    chosen = hb.choose_trial_to_run([*trials, late])
    assert chosen is trials[0]  # promoted, least recently trained
    state = hb.get_state()
    restored = HyperBandForBOHB(metric="y", mode="max", max_t=9)
    restored.set_state(state)
    assert restored.get_state() == state
    chosen.status = TrialStatus.RUNNING
    decision = hb.on_trial_result(chosen, {"training_iteration": 2, "y": 0})
    assert decision == Decision(Action.CONTINUE, others={"t3": Action.STOP})
    assert hb.release_paused() is None


def test_a_filled_bracket_halves_when_its_last_trial_reports():
    hb = HyperBandForBOHB(metric="y", mode="max", max_t=9)
    trials = [Trial(f"t{i}", {}) for i in range(9)]
    for t in trials:
        hb.on_trial_add(t)
    out = [hb.on_trial_result(t, {"training_iteration": 1, "y": i}) for i, t in enumerate(trials)]
    assert out[:-1] == [Action.PAUSE] * 8
    assert sorted(k for k, a in out[-1].others.items() if a == Action.CONTINUE) == ["t6", "t7"]
    assert [len(b) for b in hb.plan] == [3, 2, 1]  # the largest bracket first, as Ray's BOHB


# -- through the driver --------------------------------------------------------------------------
def hyperband() -> HyperBandForBOHB:
    return HyperBandForBOHB(max_t=9, reduction_factor=3)


RUN = {"num_samples": 20, "stop": {"training_iteration": 9}}


@pytest.mark.parametrize(
    "make",
    [lambda: TuneBOHB(), lambda: ConcurrencyLimiter(TuneBOHB(seed=5), 4)],
    ids=["alone", "limited"],
)
def test_replaying_the_committed_calls_gives_back_every_suggestion(tmp_path, make):
    made, again = replayed_suggestions(make(), tmp_path, scheduler=hyperband(), **RUN)
    assert len(made) == 20 and again == made


def test_a_run_is_reproducible_from_its_seed(tmp_path):
    def once(where: str, seed: int, searcher: Searcher | None = None) -> list[dict[str, Any]]:
        alg = searcher or TuneBOHB()
        sim = simulate(tmp_path / where, alg, scheduler=hyperband(), seed=seed, **RUN)
        assert {t["status"] for t in committed(tmp_path / where)["trials"]} == {"TERMINATED"}
        return configs(sim)

    first = once("a", 1)
    assert once("b", 1) == first
    assert once("c", 2) != first
    assert len({c["lr"] for c in first}) == 20
    # its own seed: the run's seed does not change the first (random) suggestions
    own = [once(w, s, TuneBOHB(seed=7)) for w, s in (("d", 1), ("e", 2))]
    assert own[0][:5] == own[1][:5]


@pytest.mark.parametrize(
    ("search_alg", "kwargs", "match"),
    [
        (lambda: TuneBOHB({"lr": uniform(0, 1)}), {}, "already given a search space"),
        (lambda: TuneBOHB(metric="loss"), {}, "`metric`"),
        (lambda: TuneBOHB(mode="min"), {}, "`mode` is 'max' for the run but 'min'"),
        (lambda: TuneBOHB(), {"param_space": {"lr": grid_search([0.1, 0.2])}}, "grid_search"),
        (lambda: TuneBOHB(), {"param_space": {"lr": sample_from(lambda _: 1)}}, "SampleFrom"),
        (lambda: TuneBOHB(), {"mode": "best"}, "mode"),
        (lambda: TuneBOHB(), {"param_space": {"lr": 0.1}}, "no search space"),
    ],
)
def test_bad_search_input_is_refused_before_anything_runs(tmp_path, search_alg, kwargs, match):
    with pytest.raises(ValueError, match=match):
        simulate(tmp_path, search_alg(), scheduler=hyperband(), **kwargs)
    assert not (tmp_path / "simulation").exists()


def test_a_limited_bohb_fills_its_brackets_as_paused_trials_free_their_slots(tmp_path):
    """Ray's rule: paused trials do not count against the limit (the driver tells the
    searcher of pauses), so the first bracket gets its nine trials though two run at
    once: six stop at its first rung (r=1), two at the second (r=3), one runs on to 9."""
    sim = simulate(tmp_path, ConcurrencyLimiter(TuneBOHB(seed=5), 2), scheduler=hyperband(), **RUN)
    ran = sorted(len(r.history) for r in sim.grid)
    assert ran.count(1) >= 6 and 9 in ran
    calls = committed(tmp_path)["search_calls"]
    paused = {c[1] for c in calls if c[0] == "p"}
    assert paused and paused <= {c[1] for c in calls if c[0] in ("u", "c")}
