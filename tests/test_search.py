"""Search algorithms (``popflow.tune.search``, Ray's ``Searcher`` API): the pure ones on
their own, and every searcher through the real driver on the simulated backend."""

from __future__ import annotations

from typing import Any

import optuna
import pytest
from support.searchers import committed, configs, replayed_suggestions, simulate

from popflow import ASHAScheduler, choice, grid_search, uniform
from popflow import tune as ray_tune
from popflow.flows.spec.run_args import load_run_args
from popflow.infra.storage.folder import Storage
from popflow.tune.search import (
    BasicVariantGenerator,
    ConcurrencyLimiter,
    Repeater,
    Searcher,
)
from popflow.tune.search.optuna import OptunaSearch

pytestmark = pytest.mark.unit


class Counting(Searcher):
    """Suggests ``{"lr": n / 10}`` for the n-th trial, forever (or ``FINISHED`` after
    ``last``); what it was told goes to the class's ``told`` (shared by the run's copy)."""

    told: list[tuple[Any, ...]] = []

    def __init__(self, last: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.last = last
        self.n = 0

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        self._metric = self._metric or metric
        self._mode = self._mode or mode
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if self.last is not None and self.n >= self.last:
            return Searcher.FINISHED
        self.n += 1
        return {"lr": self.n / 10}

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        type(self).told.append(("result", trial_id, result["training_iteration"]))

    def on_trial_complete(self, trial_id, result=None, error=False) -> None:
        type(self).told.append(("complete", trial_id, error))


# -- the pure searchers on their own --------------------------------------------------
def test_concurrency_limiter_holds_back_until_a_trial_ends():
    limiter = ConcurrencyLimiter(Counting(), max_concurrent=2)
    assert [limiter.suggest(f"t{i}") for i in range(3)] == [{"lr": 0.1}, {"lr": 0.2}, None]
    limiter.on_trial_complete("t0", {"score": 1.0})
    assert limiter.suggest("t3") == {"lr": 0.3}
    assert limiter.suggest("t4") is None


def test_a_batched_limiter_tells_its_searcher_once_the_whole_batch_ended():
    Counting.told = []
    limiter = ConcurrencyLimiter(Counting(), max_concurrent=2, batch=True)
    limiter.suggest("t0"), limiter.suggest("t1")
    limiter.on_trial_complete("t1", {"score": 1.0})
    assert Counting.told == [] and limiter.suggest("t2") is None
    limiter.on_trial_complete("t0", {"score": 2.0})
    assert Counting.told == [("complete", "t0", False), ("complete", "t1", False)]
    assert limiter.suggest("t2") == {"lr": 0.3}


def test_repeater_repeats_each_config_and_tells_the_mean():
    seen: list[tuple[str, dict[str, Any] | None]] = []

    class Recording(Counting):
        def on_trial_complete(self, trial_id, result=None, error=False):
            seen.append((trial_id, result))

    repeater = Repeater(Recording(metric="score", mode="max"), repeat=3)
    suggested = [repeater.suggest(f"t{i}") for i in range(4)]
    assert suggested[:3] == [{"lr": 0.1, "__trial_index__": i} for i in range(3)]
    assert suggested[3] == {"lr": 0.2, "__trial_index__": 0}
    for i, score in enumerate([1.0, 2.0]):
        repeater.on_trial_complete(f"t{i}", {"score": score})
    assert seen == []
    repeater.on_trial_complete("t2", {"score": 6.0})
    assert seen == [("t0", {"score": 3.0})]


def test_basic_variant_generator_evaluates_the_points_first_then_samples_then_finishes():
    gen = BasicVariantGenerator(points_to_evaluate=[{"lr": 0.5}], random_state=1)
    gen.set_search_properties(
        None, None, {"lr": uniform(0, 1), "opt": grid_search(["a", "b"])}, num_samples=2
    )
    out = [gen.suggest(f"t{i}") for i in range(5)]
    assert [c["lr"] for c in out[:2]] == [0.5, 0.5]  # the point, at each grid value
    assert [c["opt"] for c in out[:4]] == ["a", "b", "a", "b"]
    assert all(0 <= c["lr"] < 1 and c["lr"] != 0.5 for c in out[2:4])
    assert out[4] == Searcher.FINISHED and gen.total() == 4


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: ray_tune.TuneConfig(search_alg=object()), TypeError, "search_alg"),
        (lambda: Counting(mode="best"), ValueError, "mode"),
        (lambda: ConcurrencyLimiter(Counting(), max_concurrent=0), ValueError, "max_concurrent"),
        (lambda: Repeater(Counting(), repeat=0), ValueError, "repeat"),
        (lambda: OptunaSearch(metric=["a", "b"], mode="min"), ValueError, "lists"),
        (lambda: OptunaSearch(sampler="tpe"), TypeError, "sampler"),
        (
            lambda: OptunaSearch(points_to_evaluate=[{"lr": 0.1}], evaluated_rewards=[1, 2]),
            ValueError,
            "one each",
        ),
    ],
)
def test_bad_searcher_arguments_are_named(make, error, match):
    with pytest.raises(error, match=match):
        make()


# -- through the driver ---------------------------------------------------------------
def test_num_samples_bounds_a_searcher_and_finished_ends_sampling(tmp_path):
    assert len(simulate(tmp_path / "a", Counting(), num_samples=5).grid) == 5
    sim = simulate(tmp_path / "b", Counting(last=3), num_samples=10)
    assert configs(sim) == [{"lr": 0.1}, {"lr": 0.2}, {"lr": 0.3}]


def test_the_searcher_hears_every_result_once_and_every_end_once(tmp_path):
    Counting.told = []
    scheduler = ASHAScheduler(max_t=4, grace_period=1, reduction_factor=2)
    sim = simulate(tmp_path, Counting(), scheduler=scheduler, num_samples=6)
    results = [(t, i) for kind, t, i in Counting.told if kind == "result"]
    ends = [t for kind, t, _ in Counting.told if kind == "complete"]
    assert sorted(results) == sorted(
        (r.trial_id, row["training_iteration"]) for r in sim.grid for row in r.history
    )
    assert len(set(results)) == len(results)
    assert sorted(ends) == sorted(r.trial_id for r in sim.grid)
    calls = committed(tmp_path)["search_calls"]  # the same calls, committed in order
    assert [c[1] for c in calls if c[0] == "c"] == ends


def test_optuna_search_with_asha_is_reproducible_from_the_run_seed(tmp_path):
    def once(where: str, seed: int) -> list[dict[str, Any]]:
        searcher = ConcurrencyLimiter(OptunaSearch(), max_concurrent=2)
        scheduler = ASHAScheduler(max_t=4, grace_period=1, reduction_factor=2)
        sim = simulate(tmp_path / where, searcher, scheduler=scheduler, num_samples=14, seed=seed)
        assert sim.iterations < 14 * 4  # ASHA stopped some
        return configs(sim)

    first = once("a", 3)
    assert len(first) == 14 and all(0 <= c["lr"] <= 1 for c in first)
    assert once("b", 3) == first
    assert once("c", 4) != first


def test_optuna_search_learns_toward_the_best_region(tmp_path):
    """Drifting's score grows fastest at lr = 0.5: TPE's suggestions after its 10 random
    startup trials are nearer 0.5 than the random ones."""
    searcher = ConcurrencyLimiter(OptunaSearch(), max_concurrent=1)
    sim = simulate(tmp_path, searcher, num_samples=30, slots=1)
    lrs = [c["lr"] for c in configs(sim)]
    random_part, model_part = lrs[:10], lrs[10:]
    distance = [sum(abs(x - 0.5) for x in part) / len(part) for part in (random_part, model_part)]
    assert distance[1] < 0.7 * distance[0], distance


def test_optuna_points_to_evaluate_come_first_and_evaluated_rewards_are_not_run(tmp_path):
    points = [{"lr": 0.25}, {"lr": 0.75}]
    sim = simulate(tmp_path / "a", OptunaSearch(points_to_evaluate=points), num_samples=3)
    assert configs(sim)[:2] == points
    searcher = OptunaSearch(
        {"lr": optuna.distributions.FloatDistribution(0, 1)},
        metric="score",
        mode="max",
        points_to_evaluate=points,
        evaluated_rewards=[1.0, 2.0],
    )
    study = searcher.study
    assert [(t.params, t.value, t.state.name) for t in study.trials] == [
        ({"lr": 0.25}, 1.0, "COMPLETE"),
        ({"lr": 0.75}, 2.0, "COMPLETE"),
    ]
    sim = simulate(tmp_path / "b", searcher, param_space={}, num_samples=2)
    assert all(c not in points for c in configs(sim))


def test_optuna_define_by_run_spaces_may_branch(tmp_path):
    def space(trial: optuna.Trial) -> dict[str, Any]:
        optimizer = trial.suggest_categorical("optimizer", ["sgd", "adam"])
        if optimizer == "sgd":
            trial.suggest_float("momentum", 0.0, 0.9)
        trial.suggest_float("lr", 0.0, 1.0)
        return {"layers": 2}

    sim = simulate(tmp_path, OptunaSearch(space), param_space={}, num_samples=8)
    for config in configs(sim):
        assert config["layers"] == 2 and 0 <= config["lr"] <= 1
        assert ("momentum" in config) == (config["optimizer"] == "sgd")


def test_optuna_takes_several_objectives_with_lists_of_metrics_and_modes():
    searcher = OptunaSearch(
        {"x": optuna.distributions.FloatDistribution(0, 1)},
        metric=["loss", "size"],
        mode=["min", "max"],
        seed=0,
    )
    config = searcher.suggest("t0")
    searcher.on_trial_result("t0", {"loss": 1.0, "size": 2.0, "training_iteration": 1})
    searcher.on_trial_complete("t0", {"loss": 0.5, "size": 3.0})
    (trial,) = searcher.study.trials
    assert trial.params == config and trial.values == [0.5, 3.0]
    assert [d.name for d in searcher.study.directions] == ["MINIMIZE", "MAXIMIZE"]


def test_optuna_converts_every_search_space_it_can_and_names_what_it_cannot():
    from popflow.flows.integrations.optuna_search import convert_search_space

    space = {
        "a": uniform(0, 1),
        "b": {"c": ray_tune.loguniform(1e-4, 1e-1)},
        "d": ray_tune.randint(1, 5),
        "e": choice(["x", "y"]),
        "f": ray_tune.qrandint(0, 10, 2),
        "g": 7,
    }
    dist = optuna.distributions
    assert convert_search_space(space) == {
        "a": dist.FloatDistribution(0, 1),
        "b/c": dist.FloatDistribution(1e-4, 1e-1, log=True),
        "d": dist.IntDistribution(1, 4),  # Ray's randint excludes its upper bound
        "e": dist.CategoricalDistribution(["x", "y"]),
        "f": dist.IntDistribution(0, 10, step=2),
    }
    with pytest.raises(ValueError, match="grid_search"):
        convert_search_space({"a": grid_search([1, 2])})
    with pytest.raises(ValueError, match="Optuna cannot sample `n`"):
        convert_search_space({"n": ray_tune.randn()})


@pytest.mark.parametrize(
    ("search_alg", "kwargs", "match"),
    [
        (  # a searcher with its own space, and search spaces in param_space too
            lambda: OptunaSearch({"lr": optuna.distributions.FloatDistribution(0, 1)}),
            {},
            "already given a search space",
        ),
        (lambda: OptunaSearch(metric="loss"), {}, "`metric` is 'score' for the run but 'loss'"),
        (lambda: OptunaSearch(mode="min"), {}, "`mode` is 'max' for the run but 'min'"),
        (lambda: OptunaSearch(), {"metric": None, "mode": None}, "no metric"),
    ],
)
def test_bad_search_input_is_refused_before_anything_runs(tmp_path, search_alg, kwargs, match):
    with pytest.raises(ValueError, match=match):
        simulate(tmp_path, search_alg(), **kwargs)
    assert not (tmp_path / "simulation").exists()


def test_a_suggestion_that_leaves_a_search_space_unsampled_is_an_error(tmp_path):
    space = {"lr": uniform(0, 1), "wd": uniform(0, 1)}
    with pytest.raises(ValueError, match="leaves search spaces"):
        simulate(tmp_path, Counting(), param_space=space)


def test_a_run_keeps_a_fresh_copy_of_its_searcher_for_popflow_resume(tmp_path):
    searcher = ConcurrencyLimiter(OptunaSearch(), max_concurrent=2)
    simulate(tmp_path, searcher, num_samples=4)
    assert searcher.live_trials == set()  # the run drove a copy
    kept = load_run_args(Storage(str(tmp_path / "simulation")))["search_alg"]
    assert isinstance(kept, ConcurrencyLimiter) and kept.live_trials == set()
    assert isinstance(kept.searcher, OptunaSearch) and kept.searcher._study is None


def test_replaying_optuna_search_calls_gives_back_every_suggestion(tmp_path):
    """What a resume does (tests/test_search_resume.py kills real drivers)."""
    searcher = ConcurrencyLimiter(OptunaSearch(), max_concurrent=2)
    scheduler = ASHAScheduler(max_t=4, grace_period=1, reduction_factor=2)
    made, again = replayed_suggestions(searcher, tmp_path, scheduler=scheduler, num_samples=12)
    assert len(made) == 12 and again == made
