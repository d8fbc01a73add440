"""PopulationBasedTraining: its pure parts, and whole runs of the real driver on the
simulated backend (in this process, on a virtual clock; no cluster)."""

from __future__ import annotations

import copy
import json
import logging
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.examples import examples
from support.simulated import SimulatedRun, simulated
from trainables import ParityFailing, trial_index

from popflow.schedulers.pbt import PopulationBasedTraining, explore, quantiles
from popflow.schedulers.search_space import grid_search, sample_from, uniform
from popflow.schedulers.trial import Trial, TrialStatus
from popflow.schedulers.trial_scheduler import Action, Decision

pytestmark = pytest.mark.unit


def make_pbt(**kwargs: Any) -> PopulationBasedTraining:
    args: dict[str, Any] = {
        "time_attr": "training_iteration",
        "metric": "mean_accuracy",
        "mode": "max",
        "perturbation_interval": 1,
        "hyperparam_mutations": {"c": lambda: 1},
        "rng": np.random.default_rng(0),
    }
    args.update(kwargs)
    return PopulationBasedTraining(**args)


def run_pbt(
    pbt: PopulationBasedTraining,
    a_values: list[int],
    stop_at: int = 3,
    stop_overrides: dict[str, int] | None = None,
    fail_at: dict[str, int] | None = None,
    slots: int = 1,
    duration: Any = 1.0,
) -> SimulatedRun:
    """The real driver on the simulated backend: trial ``t<i>`` has ``a = a_values[i]``
    and reports ``mean_accuracy = iteration + a`` each iteration, with ``a`` in its
    checkpoint (Ray's PBT test trainable); it ends at ``stop_at`` (or its own in
    ``stop_overrides``) and raises at its iteration in ``fail_at``."""
    stops = {int(k[1:]): v for k, v in (stop_overrides or {}).items()}
    fails = {int(k[1:]): v for k, v in (fail_at or {}).items()}
    trainable = type("Parity", (ParityFailing,), {"fail_at": fails})
    return simulated(
        trainable,
        {"a": grid_search(a_values), "c": 1},
        pbt,
        stop=lambda trial_id, result: (
            result["training_iteration"] >= stops.get(trial_index(trial_id), stop_at)
        ),
        slots=slots,
        duration=duration,
    )


# -- validation ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"quantile_fraction": 0.6},
            r"`quantile_fraction` is 0\.6, but must be between 0 and 0\.5",
        ),
        ({"quantile_fraction": -0.1}, r"`quantile_fraction` is -0\.1, but must be between 0 and"),
        ({"perturbation_interval": 0}, r"`perturbation_interval` is 0, but must be > 0"),
        ({"perturbation_interval": -5.0}, r"`perturbation_interval` is -5\.0, but must be > 0"),
        ({"burn_in_period": -1}, r"`burn_in_period` is -1, but must be >= 0"),
        ({"resample_probability": 1.5}, r"`resample_probability` is 1\.5, but must be between 0"),
        ({"perturbation_factors": ()}, r"`perturbation_factors` is \(\), but must hold at least"),
        ({"mode": "maximize"}, r"`mode` is 'maximize', but must be 'min' or 'max'"),
        (
            {"hyperparam_mutations": None},
            r"`hyperparam_mutations` is None and `custom_explore_fn` is None, but PBT needs",
        ),
        (
            {"hyperparam_mutations": {}},
            r"`hyperparam_mutations` is \{\} and `custom_explore_fn` is None",
        ),
        (
            {"hyperparam_mutations": {"lr": 0.1}},
            r"`hyperparam_mutations\['lr'\]` is 0\.1 \(type float\), but must be a dict \(nested\)",
        ),
        (
            {"hyperparam_mutations": {"opt": {"mom": "fast"}}},
            r"`hyperparam_mutations\['opt/mom'\]` is 'fast' \(type str\)",
        ),
        (
            {"hyperparam_mutations": {"bs": []}},
            r"`hyperparam_mutations\['bs'\]` is an empty list, but a categorical mutation",
        ),
        (
            {"hyperparam_mutations": {"lr": sample_from(lambda spec: 0.1)}},
            r"`hyperparam_mutations\['lr'\]` is a sample_from\(\) domain, but arbitrary",
        ),
        (
            {"hyperparam_mutations": None, "custom_explore_fn": 3},
            r"`custom_explore_fn` is 3, but must be a callable",
        ),
    ],
)
def test_invalid_arguments_are_named(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_pbt(**kwargs)


def test_ray_defaults() -> None:
    pbt = PopulationBasedTraining(hyperparam_mutations={"lr": [0.1, 0.01]})
    assert pbt.time_attr == "time_total_s"
    assert (pbt.metric, pbt.mode) == (None, None)
    assert pbt.synchronous is False
    assert pbt.log_config is True
    assert pbt.next_milestone(Trial("t0", {"lr": 0.1})) == 60.0
    assert PopulationBasedTraining(custom_explore_fn=lambda c: c, synch=True).synchronous


def test_metric_and_mode_are_required_at_run_start() -> None:
    pbt = make_pbt(metric=None, mode=None)
    with pytest.raises(ValueError, match=r"set them on the scheduler .*run\(metric=\.\.\., mode="):
        pbt.on_trial_add(Trial("t0", {"c": 1}))
    assert pbt.set_search_properties("mean_accuracy", "max")
    pbt.on_trial_add(Trial("t0", {"c": 1}))


def test_trial_config_must_hold_mutation_keys() -> None:
    with pytest.raises(ValueError, match=r"lacks mutation keys \['c'\].*complete_config"):
        make_pbt().on_trial_add(Trial("t0", {"a": 1}))


def test_missing_result_keys_raise_when_required() -> None:
    pbt = make_pbt()
    trial = Trial("t0", {"c": 1})
    pbt.on_trial_add(trial)
    with pytest.raises(
        ValueError, match=r"lacks \['mean_accuracy'\] \(keys present: \['loss', 'training_it"
    ):
        pbt.on_trial_result(trial, {"training_iteration": 1, "loss": 0.3})
    with pytest.raises(ValueError, match=r"lacks \['training_iteration'\]"):
        pbt.on_trial_result(trial, {"mean_accuracy": 0.3})


def test_missing_result_keys_warn_and_continue_when_not_required(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pbt = make_pbt(require_attrs=False)
    trials = [Trial(f"t{i}", {"c": 1}) for i in range(2)]
    for t in trials:
        pbt.on_trial_add(t)
    pbt.on_trial_result(trials[0], {"training_iteration": 1, "mean_accuracy": 5.0})
    with caplog.at_level(logging.WARNING, logger="popflow.schedulers.pbt"):
        decision = pbt.on_trial_result(trials[1], {"training_iteration": 1})
    assert decision == Decision(Action.CONTINUE)
    assert "lacks ['mean_accuracy']" in caplog.text
    # It was not ranked: with one scored trial nothing is exploited later either.
    assert (
        pbt.on_trial_result(trials[0], {"training_iteration": 2, "mean_accuracy": 0}).exploits == ()
    )


# -- complete_config -----------------------------------------------------------
def test_complete_config_samples_missing_keys_into_a_copy() -> None:
    pbt = make_pbt(
        hyperparam_mutations={
            "lr": lambda: 0.5,
            "bs": [16, 32, 64],
            "opt": {"mom": [0.8, 0.9], "wd": lambda: 1e-4},
        }
    )
    config = {"lr": 0.1, "opt": {"mom": 0.9}, "other": [1, 2]}
    before = copy.deepcopy(config)
    filled = pbt.complete_config(config)
    assert config == before
    assert filled["lr"] == 0.1 and filled["opt"]["mom"] == 0.9 and filled["other"] == [1, 2]
    assert filled["bs"] in (16, 32, 64) and type(filled["bs"]) is int
    assert filled["opt"]["wd"] == 1e-4
    assert pbt.complete_config({})["opt"]["mom"] in (0.8, 0.9)


def test_search_space_domain_is_a_continuous_mutation() -> None:
    pbt = make_pbt(hyperparam_mutations={"lr": uniform(0.0, 1.0)})
    value = pbt.complete_config({})["lr"]
    assert isinstance(value, float) and 0.0 <= value <= 1.0
    mutations = {"lr": uniform(0.0, 1.0)}
    new, ops = explore({"lr": 2.0}, mutations, 1.0, (1.2,), None, np.random.default_rng(5))
    assert ops == {"lr": "resample"} and 0.0 <= new["lr"] < 1.0
    assert new == explore({"lr": 2.0}, mutations, 1.0, (1.2,), None, np.random.default_rng(5))[0]
    new, ops = explore({"lr": 2.0}, mutations, 0.0, (1.2,), None, np.random.default_rng(5))
    assert (new, ops) == ({"lr": 2.4}, {"lr": "* 1.2"})


# -- explore -------------------------------------------------------------------
def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_explore_continuous_perturbs_by_a_factor_or_resamples() -> None:
    seen = set()
    for seed in range(40):
        new, ops = explore({"lr": 1.0}, {"lr": lambda: 7.0}, 0.25, (1.2, 0.8), None, rng(seed))
        seen.add((ops["lr"], new["lr"]))
    assert seen == {("* 1.2", 1.2), ("* 0.8", 0.8), ("resample", 7.0)}
    new, ops = explore({"lr": 1.0}, {"lr": lambda: 7.0}, 1.0, (1.2, 0.8), None, rng())
    assert (new, ops) == ({"lr": 7.0}, {"lr": "resample"})


def test_explore_rounds_ints_and_keeps_bools() -> None:
    ints = {explore({"bs": 3}, {"bs": lambda: 5}, 0.0, (1.2,), None, rng())[0]["bs"]}
    assert ints == {4}  # round(3.6); Ray's int() would give 3
    new, _ = explore({"flag": True}, {"flag": lambda: False}, 0.0, (0.8,), None, rng())
    assert new["flag"] is True


def test_explore_categorical_edges_and_unknown_values() -> None:
    outcomes = set()
    for seed in range(30):
        new, ops = explore({"bs": 16}, {"bs": [16, 32, 64]}, 0.0, (1.2,), None, rng(seed))
        outcomes.add((ops["bs"], new["bs"]))
    assert outcomes == {("shift left (noop)", 16), ("shift right", 32)}
    new, ops = explore({"bs": 48}, {"bs": (16, 32, 64)}, 0.0, (1.2,), None, rng())
    assert ops == {"bs": "resample"} and new["bs"] in (16, 32, 64)


def test_explore_nested_logs_flat_paths_and_never_mutates() -> None:
    config = {"opt": {"mom": 0.9, "lr": 0.1}, "keep": [1]}
    mutations = {"opt": {"mom": [0.8, 0.9, 0.99], "lr": lambda: 0.5}}
    before = copy.deepcopy(config)
    new, ops = explore(config, mutations, 0.5, (1.2, 0.8), None, rng(3))
    assert config == before
    assert set(ops) == {"opt/mom", "opt/lr"}
    assert new["keep"] == [1] and new["keep"] is not config["keep"]


def test_custom_explore_fn_runs_after_builtin_mutation() -> None:
    def bump(config: dict[str, Any]) -> dict[str, Any]:
        config["seen"] = config["lr"]
        return config

    new, ops = explore({"lr": 1.0}, {"lr": lambda: 5.0}, 0.0, (2.0,), bump, rng())
    assert new == {"lr": 2.0, "seen": 2.0} and ops == {"lr": "* 2.0"}
    with pytest.raises(TypeError, match=r"`custom_explore_fn` returned None .*must return"):
        explore({"lr": 1.0}, {}, 0.0, (2.0,), lambda c: None, rng())


def test_explore_names_a_missing_key() -> None:
    with pytest.raises(ValueError, match=r"cannot explore `opt/mom`: the config has no such key"):
        explore({"opt": {}}, {"opt": {"mom": [0.9]}}, 0.0, (1.2,), None, rng())


NUMBERS = st.one_of(st.integers(-1000, 1000), st.floats(-1e6, 1e6, allow_nan=False), st.booleans())


@given(value=NUMBERS, resampled=NUMBERS, p=st.floats(0, 1), seed=st.integers(0, 2**32 - 1))
def test_explore_keeps_types(value: Any, resampled: Any, p: float, seed: int) -> None:
    new, ops = explore({"x": value}, {"x": lambda: resampled}, p, (1.2, 0.8), None, rng(seed))
    assert type(new["x"]) is type(value)
    assert ops["x"] in ("resample", "* 1.2", "* 0.8")


@given(
    values=st.lists(st.integers(), min_size=1, max_size=8, unique=True),
    data=st.data(),
    p=st.floats(0, 1),
    seed=st.integers(0, 2**32 - 1),
)
def test_explore_categorical_stays_in_set_and_shifts_one(
    values: list[int], data: st.DataObject, p: float, seed: int
) -> None:
    value = data.draw(st.sampled_from(values))
    new, ops = explore({"x": value}, {"x": values}, p, (1.2,), None, rng(seed))
    assert new["x"] in values
    if ops["x"] != "resample":
        assert ops["x"].startswith("shift")
        assert abs(values.index(new["x"]) - values.index(value)) <= 1
    if p == 0:
        assert ops["x"] != "resample"


# -- quantiles -----------------------------------------------------------------
@given(
    scores=st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=40),
    fraction=st.floats(0, 0.5),
)
def test_quantiles_never_overlap_and_rank_by_score(scores: list[float], fraction: float) -> None:
    pairs = [(f"t{i}", s) for i, s in enumerate(scores)]
    lower, upper = quantiles(pairs, fraction)
    n = len(scores)
    expected = 0 if n < 2 else min(math.ceil(n * fraction), n // 2)
    assert len(lower) == len(upper) == expected
    assert not set(lower) & set(upper)
    by_id = dict(pairs)
    if lower:
        assert max(by_id[t] for t in lower) <= min(by_id[t] for t in upper)


def test_quantiles_follow_ray_sizes() -> None:
    pairs = [(f"t{i}", float(i)) for i in range(8)]
    assert quantiles(pairs, 0.25) == (["t0", "t1"], ["t6", "t7"])
    assert quantiles(pairs[:3], 0.5) == (["t0"], ["t2"])
    assert quantiles(pairs, 0.0) == ([], [])


def test_no_exploit_with_fewer_than_two_scored_trials() -> None:
    pbt = make_pbt()
    trials = [Trial(f"t{i}", {"c": 1}) for i in range(3)]
    for t in trials:
        pbt.on_trial_add(t)
    for it in range(1, 6):
        decision = pbt.on_trial_result(trials[0], {"training_iteration": it, "mean_accuracy": -it})
        assert decision.exploits == ()
    nan_result = {"training_iteration": 1, "mean_accuracy": float("nan")}
    assert pbt.on_trial_result(trials[1], nan_result).exploits == ()
    low = {"training_iteration": 6, "mean_accuracy": -100}
    assert pbt.on_trial_result(trials[0], low).exploits == ()
    pbt.on_trial_result(trials[2], {"training_iteration": 1, "mean_accuracy": 10})
    assert pbt.on_trial_result(trials[0], {"training_iteration": 7, "mean_accuracy": -100}).exploits


# -- the exploit record and milestones -----------------------------------------
def test_async_exploit_carries_ray_policy_fields() -> None:
    pbt = make_pbt(hyperparam_mutations={"lr": [0.1, 0.2, 0.3]}, quantile_fraction=0.5)
    good = Trial("good", {"lr": 0.2, "x": 1}, experiment_tag="0_lr=0.2")
    bad = Trial("bad", {"lr": 0.1, "x": 2}, experiment_tag="1_lr=0.1")
    pbt.on_trial_add(good)
    pbt.on_trial_add(bad)
    pbt.on_trial_result(bad, {"training_iteration": 3, "mean_accuracy": 0.5})
    pbt.on_trial_result(good, {"training_iteration": 4, "mean_accuracy": 9.0})  # top: kept
    decision = pbt.on_trial_result(bad, {"training_iteration": 5, "mean_accuracy": 1.0})
    assert decision == Action.CONTINUE
    (ex,) = decision.exploits
    assert (ex.trial_id, ex.source_trial_id) == ("bad", "good")
    assert (ex.target_iteration, ex.source_iteration) == (5, 4)
    assert ex.source_config == {"lr": 0.2, "x": 1}
    assert ex.new_config["x"] == 1 and ex.new_config["lr"] in (0.1, 0.2, 0.3)
    assert (ex.target_tag, ex.source_tag) == ("1_lr=0.1", "0_lr=0.2")
    assert ex.new_tag == f"1_lr=0.1@perturbed[lr={ex.new_config['lr']:.4f}]"
    assert ex.policy_entry()[:4] == ["1_lr=0.1", "0_lr=0.2", 5, 4]
    # The target takes over the source's clock; its own score stays until it reports.
    assert pbt.next_milestone(bad) == 5
    bad_state = next(s for s in pbt.get_state()["trials"] if s["trial_id"] == "bad")
    assert bad_state["last_score"] == 1.0 and bad_state["last_perturbation_time"] == 4
    assert pbt.debug_string() == "PopulationBasedTraining: 1 checkpoints, 1 perturbs"


def test_mode_min_ranks_lower_metric_higher() -> None:
    pbt = make_pbt(mode="min", quantile_fraction=0.5)
    trials = [Trial(f"t{i}", {"c": 1}) for i in range(2)]
    for t in trials:
        pbt.on_trial_add(t)
    pbt.on_trial_result(trials[1], {"training_iteration": 1, "mean_accuracy": 0.5})
    pbt.on_trial_result(trials[0], {"training_iteration": 1, "mean_accuracy": 0.1})
    decision = pbt.on_trial_result(trials[1], {"training_iteration": 2, "mean_accuracy": 0.5})
    assert [ex.source_trial_id for ex in decision.exploits] == ["t0"]


def test_a_clone_of_an_exploited_trial_logs_the_checkpoint_iteration() -> None:
    pbt = make_pbt(quantile_fraction=0.5)
    t0, t1 = Trial("t0", {"c": 1}), Trial("t1", {"c": 1})
    pbt.on_trial_add(t0)
    pbt.on_trial_add(t1)
    pbt.on_trial_result(t1, {"training_iteration": 1, "mean_accuracy": 0})
    pbt.on_trial_result(t0, {"training_iteration": 2, "mean_accuracy": 10})
    (first,) = pbt.on_trial_result(t1, {"training_iteration": 6, "mean_accuracy": 1}).exploits
    assert (first.trial_id, first.source_iteration) == ("t1", 2)
    # t1 now holds t0's iteration-2 checkpoint (but keeps its own score 1, as in Ray) and
    # continues from iteration 2
    assert pbt.next_milestone(t1) == 3
    # t0 ranks t1 top now, but t1 ranked bottom when it last reported: Ray kept no
    # checkpoint of it to clone, so t0 keeps its own state
    assert pbt.on_trial_result(t0, {"training_iteration": 3, "mean_accuracy": -5}).exploits == ()
    pbt.on_trial_result(t1, {"training_iteration": 3, "mean_accuracy": 20})  # top: kept
    (second,) = pbt.on_trial_result(t0, {"training_iteration": 4, "mean_accuracy": -5}).exploits
    assert (second.source_trial_id, second.target_iteration, second.source_iteration) == (
        "t1",
        4,
        3,
    )


def test_scores_are_taken_at_perturbation_points_only() -> None:
    """As in Ray: a trial is ranked on the result its latest checkpoint belongs to."""
    pbt = make_pbt(quantile_fraction=0.5, perturbation_interval=2)
    t0, t1 = Trial("t0", {"c": 1}), Trial("t1", {"c": 1})
    pbt.on_trial_add(t0)
    pbt.on_trial_add(t1)
    pbt.on_trial_result(t1, {"training_iteration": 2, "mean_accuracy": 5})
    pbt.on_trial_result(t0, {"training_iteration": 2, "mean_accuracy": 10})
    assert pbt.on_trial_result(t0, {"training_iteration": 3, "mean_accuracy": -100}) == Decision(
        Action.CONTINUE
    )
    (ex,) = pbt.on_trial_result(t1, {"training_iteration": 4, "mean_accuracy": 6}).exploits
    assert ex.source_trial_id == "t0"  # ranked on t0's 10 at iteration 2, not on -100


def test_next_milestone_interval_and_burn_in() -> None:
    pbt = make_pbt(perturbation_interval=3, burn_in_period=7)
    trial = Trial("t0", {"c": 1})
    pbt.on_trial_add(trial)
    assert pbt.next_milestone(trial) == 7
    result = {"training_iteration": 5, "mean_accuracy": 1.0}
    assert pbt.on_trial_result(trial, result) == Action.CONTINUE
    assert pbt.next_milestone(trial) == 7  # burn-in: no perturbation point yet
    pbt.on_trial_result(trial, {"training_iteration": 8, "mean_accuracy": 1.0})
    assert pbt.next_milestone(trial) == 11


def test_choose_trial_to_run_least_progress_first() -> None:
    pbt = make_pbt()
    trials = [Trial(f"t{i}", {"c": 1}, status=TrialStatus.PAUSED) for i in range(3)]
    for t in trials:
        pbt.on_trial_add(t)
    pbt.on_trial_result(trials[0], {"training_iteration": 4, "mean_accuracy": 1})
    pbt.on_trial_result(trials[1], {"training_iteration": 2, "mean_accuracy": 1})
    pbt.on_trial_result(trials[2], {"training_iteration": 3, "mean_accuracy": 1})
    assert pbt.choose_trial_to_run(trials) is trials[1]
    trials[1].status = TrialStatus.RUNNING
    assert pbt.choose_trial_to_run(trials) is trials[2]
    assert pbt.choose_trial_to_run([trials[1]]) is None


@settings(max_examples=examples(150), deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(list(TrialStatus)), st.integers(0, 4)), min_size=1, max_size=12
    ),
    st.booleans(),
    st.one_of(st.none(), st.integers(0, 12)),
)
def test_choosing_many_at_once_picks_what_choosing_one_by_one_picks(members, synch, limit):
    """PBT sorts once; the default asks choose_trial_to_run again and again. Both give
    what picking one trial at a time (and starting it) gives."""
    from popflow.schedulers import FIFOScheduler

    pbt = make_pbt(synch=synch)
    trials = [Trial(f"t{i}", {"c": 1}) for i in range(len(members))]
    for trial, (status, iteration) in zip(trials, members, strict=True):
        pbt.on_trial_add(trial)
        if iteration:
            pbt.on_trial_result(trial, {"training_iteration": iteration, "mean_accuracy": 1})
        trial.status = status
    for scheduler in (pbt, FIFOScheduler()):
        batch = [t.trial_id for t in scheduler.choose_trials_to_run(trials, limit)]
        statuses = [t.status for t in trials]
        one_by_one = []
        while limit is None or len(one_by_one) < limit:
            chosen = scheduler.choose_trial_to_run(trials)
            if chosen is None:
                break
            one_by_one.append(chosen.trial_id)
            chosen.status = TrialStatus.RUNNING
        for trial, status in zip(trials, statuses, strict=True):
            trial.status = status
        assert batch == one_by_one


# -- Ray parity: test_trial_scheduler_pbt.py's synch scenario -------------------
@pytest.mark.parametrize(("a_values", "final"), [([10, 20, 40], 43), ([30, 20, 10], 33)])
def test_synch_exploits_the_whole_cohort_like_ray(a_values: list[int], final: int) -> None:
    run = run_pbt(make_pbt(synch=True), a_values)
    assert run.final == {"t0": final, "t1": final, "t2": final}
    assert all(t.status == TrialStatus.TERMINATED for t in run.trials.values())
    pauses = [d for d in run.decided if d == Action.PAUSE]
    assert len(pauses) == 4  # two trials wait at each of the two barriers


def test_async_judges_each_result_as_it_arrives() -> None:
    """Ray's testAsynchFail: trials step a/20 s per iteration, so the fast, weak
    t1 finishes before it is judged against the slow, strong t2, while t0 keeps
    copying the best checkpoint available when its own results arrive.

    Each iteration takes 1 ms more than a/20 s, so that no two results arrive at the same
    virtual moment: results that do are reduced together, in trial order (t0's second
    before t1's first here); the extra 1 ms orders them as they were sent."""
    run = run_pbt(
        make_pbt(synch=False), [10, 20, 40], slots=3, duration=lambda r: r["a"] / 20 + 0.001
    )
    assert run.final == {"t0": 43, "t1": 23, "t2": 43}
    exploits = [
        (name, f"t{trial_index(ex.source_trial_id)}")
        for name, _, d in run.decisions
        for ex in d.exploits
    ]
    assert exploits == [("t0", "t1"), ("t0", "t2"), ("t0", "t2")]
    assert run.exploits == exploits  # each one carried out


# -- synch barrier: leaving trials never hang the cohort ------------------------
def test_synch_barrier_waits_then_releases_every_paused_trial() -> None:
    pbt = make_pbt(synch=True)
    trials = [Trial(f"t{i}", {"c": 1}) for i in range(3)]
    for t in trials:
        pbt.on_trial_add(t)
    for i, t in enumerate(trials[:2]):
        assert pbt.on_trial_result(t, {"training_iteration": 1, "mean_accuracy": i}) == Action.PAUSE
    assert pbt.choose_trial_to_run([*trials[:2], trials[2]]) is trials[2]
    assert pbt.release_paused() is None  # t2 is still training
    decision = pbt.on_trial_result(trials[2], {"training_iteration": 1, "mean_accuracy": 9})
    assert decision.action == Action.CONTINUE
    assert dict(decision.others) == {"t0": Action.CONTINUE, "t1": Action.CONTINUE}
    assert [(ex.trial_id, ex.source_trial_id) for ex in decision.exploits] == [("t0", "t2")]
    assert [s["last_perturbation_time"] for s in pbt.get_state()["trials"]] == [1, 1, 1]
    assert all(pbt.next_milestone(t) == 2 for t in trials)


def test_synch_trial_joins_the_barrier_only_at_its_milestone() -> None:
    pbt = make_pbt(synch=True, time_attr="time_total_s", perturbation_interval=10)
    trials = [Trial(f"t{i}", {"c": 1}) for i in range(3)]
    for t in trials:
        pbt.on_trial_add(t)
    for t, time in zip(trials, (10.0, 25.0, 12.0), strict=True):
        decision = pbt.on_trial_result(t, {"time_total_s": time, "mean_accuracy": time})
    assert dict(decision.others) == {"t0": Action.CONTINUE, "t1": Action.CONTINUE}
    # Ray's next sync point: max(10 + 10, latest time 25); the round's time is 12.
    assert [pbt.next_milestone(t) for t in trials] == [25.0, 25.0, 25.0]
    early = {"time_total_s": 23.0, "mean_accuracy": 0.0}
    assert pbt.on_trial_result(trials[0], early) == Decision(Action.CONTINUE)
    late = {"time_total_s": 25.5, "mean_accuracy": 0.0}
    assert pbt.on_trial_result(trials[0], late) == Decision(Action.PAUSE)


def test_synch_release_when_the_awaited_trial_completes() -> None:
    pbt = make_pbt(synch=True)
    trials = [Trial(f"t{i}", {"c": 1}, status=TrialStatus.PAUSED) for i in range(3)]
    for t in trials:
        pbt.on_trial_add(t)
    for i, t in enumerate(trials[:2]):
        pbt.on_trial_result(t, {"training_iteration": 1, "mean_accuracy": i})
    assert pbt.choose_trial_to_run(trials) is trials[2]
    pbt.on_trial_complete(trials[2], {"training_iteration": 1, "mean_accuracy": 5})
    decision = pbt.release_paused()
    assert decision is not None
    assert dict(decision.others) == {"t0": Action.CONTINUE, "t1": Action.CONTINUE}
    assert [(ex.trial_id, ex.source_trial_id) for ex in decision.exploits] == [("t0", "t1")]
    assert pbt.release_paused() is None
    assert pbt.choose_trial_to_run(trials[:2]) is trials[0]


@pytest.mark.parametrize(
    "leaver",
    [
        {"stop_overrides": {"t2": 2}},  # the last trial in order completes mid-run
        {"fail_at": {"t2": 2}},  # ... or errors
        {"stop_overrides": {"t1": 2}},  # a middle trial completes: t2 still closes the round
        {"fail_at": {"t0": 2}},
    ],
)
def test_synch_cohort_finishes_when_a_trial_leaves(leaver: dict[str, Any]) -> None:
    run = run_pbt(make_pbt(synch=True), [10, 20, 40], stop_at=4, **leaver)
    left = set(leaver.get("stop_overrides", {})) | set(leaver.get("fail_at", {}))
    stayed = set(run.trials) - left
    assert {tid: run.final[tid] for tid in stayed} == dict.fromkeys(stayed, 44)
    # none hangs: every trial ended (the synch barrier released the rest)
    assert all(t.status in (TrialStatus.TERMINATED, TrialStatus.ERROR) for t in run.trials.values())


def test_async_mode_needs_no_release() -> None:
    assert make_pbt().release_paused() is None


# -- determinism and persistence -----------------------------------------------
MUTATIONS = {"lr": lambda: 0.5, "bs": [16, 32, 64, 128], "opt": {"mom": [0.8, 0.9, 0.99]}}
SCORES = st.one_of(st.floats(-1e6, 1e6), st.just(float("nan")))


def pbt_for_property(synch: bool, interval: int, seed: int) -> PopulationBasedTraining:
    return make_pbt(
        synch=synch,
        perturbation_interval=interval,
        hyperparam_mutations=MUTATIONS,
        quantile_fraction=0.5,
        resample_probability=0.3,
        rng=rng(seed),
    )


def new_population(pbt: PopulationBasedTraining, n: int) -> list[Trial]:
    trials = []
    for i in range(n):
        config = pbt.complete_config({"lr": 0.1 * (i + 1)})
        trials.append(Trial(f"t{i}", config, experiment_tag=str(i)))
        pbt.on_trial_add(trials[-1])
    return trials


def feed(
    pbt: PopulationBasedTraining, trials: list[Trial], scores: list[float], start: int = 0
) -> list[Decision]:
    """Result ``start + j`` comes from trial ``(start + j) % n`` (round robin, trial
    order, as the synch controller feeds a round), one iteration later than its last."""
    decisions = []
    by_id = {t.trial_id: t for t in trials}
    for j, value in enumerate(scores, start):
        trial = trials[j % len(trials)]
        it = trial.last_result.get("training_iteration", 0) + 1
        result = {"training_iteration": it, "mean_accuracy": value}
        decision = pbt.on_trial_result(trial, result)
        trial.last_result = result
        for ex in decision.exploits:
            by_id[ex.trial_id].config = copy.deepcopy(ex.new_config)
        decisions.append(decision)
    return decisions


population = st.tuples(
    st.integers(2, 6), st.lists(SCORES, min_size=1, max_size=30), st.integers(0, 30)
)


@settings(max_examples=examples(60), deadline=None)
@given(
    pop=population,
    synch=st.booleans(),
    interval=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**32 - 1),
)
def test_same_seed_same_decisions(
    pop: tuple[int, list[float], int], synch: bool, interval: int, seed: int
) -> None:
    n, scores, _ = pop
    runs = []
    for _ in range(2):
        pbt = pbt_for_property(synch, interval, seed)
        runs.append(feed(pbt, new_population(pbt, n), scores))
    assert runs[0] == runs[1]


@settings(max_examples=examples(60), deadline=None)
@given(
    pop=population,
    synch=st.booleans(),
    interval=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**32 - 1),
)
def test_state_round_trip_gives_identical_future_decisions(
    pop: tuple[int, list[float], int], synch: bool, interval: int, seed: int
) -> None:
    """Snapshot after any result (mid-round too), restore into a fresh scheduler."""
    n, scores, cut = pop
    cut = min(cut, len(scores))
    pbt_a = pbt_for_property(synch, interval, seed)
    trials_a = new_population(pbt_a, n)
    feed(pbt_a, trials_a, scores[:cut])
    snapshot = json.loads(json.dumps(pbt_a.get_state()))

    pbt_b = pbt_for_property(synch, interval, seed + 1)  # its own rng state is overwritten
    pbt_b.set_state(snapshot)
    trials_b = copy.deepcopy(trials_a)

    rest = scores[cut:]
    assert feed(pbt_a, trials_a, rest, cut) == feed(pbt_b, trials_b, rest, cut)
    assert json.dumps(pbt_a.get_state()) == json.dumps(pbt_b.get_state())
    assert pbt_a.debug_string() == pbt_b.debug_string()
