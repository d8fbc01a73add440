"""PB2: the GP's pure parts on fixed data, and whole runs of the real driver on the
simulated backend."""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.linalg import LinAlgError
from scipy.optimize import approx_fprime, minimize
from support.examples import examples
from support.simulated import SimulatedRun, simulated, space_of
from trainables import Gaining, gain

from popflow.schedulers import pb2 as pb2_module
from popflow.schedulers import pb2_gp as gp_module
from popflow.schedulers.pb2 import PB2
from popflow.schedulers.pb2_gp import (
    THETA0,
    THETA_BOUNDS,
    fit_gp,
    log_marginal_likelihood,
    maximise_ucb,
    normalize,
    reward_changes,
    select_config,
    select_length,
    standardize,
    tv_squared_exp,
    ucb_kappa,
)
from popflow.schedulers.search_space import (
    choice,
    grid_search,
    loguniform,
    qloguniform,
    qrandint,
    randint,
    randn,
    sample_from,
    uniform,
)
from popflow.schedulers.trial import Trial, TrialStatus
from popflow.schedulers.trial_scheduler import Action, Exploit

pytestmark = pytest.mark.unit


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def gp_data(n: int, d: int = 1, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Scaled inputs [t, r_before, h...] in [0, 1] and a smooth standardized target."""
    g = rng(seed)
    x = g.uniform(0, 1, (n, 2 + d))
    y = np.sin(3 * x[:, 2]) + 0.5 * x[:, 1] + 0.05 * g.normal(size=n)
    return x, standardize(y)


# -- the kernel ------------------------------------------------------------------
def test_kernel_is_the_time_varying_squared_exponential() -> None:
    x1 = np.array([[0.0, 0.1, 0.2], [2.0, 0.5, 0.4]])
    x2 = np.array([[1.0, 0.3, 0.0], [0.0, 0.1, 0.2], [4.0, 1.0, 1.0]])
    variance, lengthscale, epsilon = 1.7, 0.4, 0.2
    k = tv_squared_exp(x1, x2, np.log([variance, lengthscale, epsilon]))
    for i in range(2):
        for j in range(3):
            sq = float(np.sum((x1[i, 1:] - x2[j, 1:]) ** 2))
            dt = abs(x1[i, 0] - x2[j, 0])
            expected = variance * math.exp(-sq / lengthscale) * (1 - epsilon) ** (dt / 2)
            assert k[i, j] == pytest.approx(expected, rel=1e-12)
    assert k[0, 1] == pytest.approx(variance)  # the same point: σ²
    # ε is clipped to [1e-5, 0.5], as in Ray
    big = tv_squared_exp(x1, x2, np.log([1.0, 1.0, 0.9]))
    assert np.allclose(big, tv_squared_exp(x1, x2, np.log([1.0, 1.0, 0.5])))


@settings(max_examples=examples(40), deadline=None)
@given(
    theta=st.tuples(
        st.floats(math.log(1e-2), math.log(1e2)),
        st.floats(math.log(1e-2), math.log(1e2)),
        st.floats(math.log(1e-3), math.log(0.45)),
    ),
    seed=st.integers(0, 2**32 - 1),
)
def test_kernel_gradient_matches_finite_differences(
    theta: tuple[float, float, float], seed: int
) -> None:
    x = rng(seed).uniform(0, 3, (5, 3))
    theta_arr = np.array(theta)
    k, dk = tv_squared_exp(x, x, theta_arr, gradient=True)
    assert np.array_equal(k, tv_squared_exp(x, x, theta_arr))
    h = 1e-6
    for p in range(3):
        step = np.zeros(3)
        step[p] = h
        numeric = (
            tv_squared_exp(x, x, theta_arr + step) - tv_squared_exp(x, x, theta_arr - step)
        ) / (2 * h)
        assert np.allclose(dk[:, :, p], numeric, rtol=1e-5, atol=1e-7)


def test_likelihood_gradient_matches_finite_differences() -> None:
    x, y = gp_data(30, d=2)
    for theta in (THETA0, np.log([2.0, 0.3, 0.02]), np.log([0.5, 5.0, 0.4])):
        _, grad = log_marginal_likelihood(theta, x, y)
        numeric = approx_fprime(theta, lambda t: log_marginal_likelihood(t, x, y)[0], 1e-6)
        assert np.allclose(grad, numeric, rtol=1e-4, atol=1e-4)


def test_fit_reaches_the_optimum_of_a_numeric_gradient_search() -> None:
    x, y = gp_data(40, d=1, seed=3)
    gp = fit_gp(x, y)
    numeric = minimize(
        lambda t: -log_marginal_likelihood(t, x, y)[0],
        THETA0,
        method="L-BFGS-B",
        bounds=THETA_BOUNDS,
    )
    assert gp.log_marginal_likelihood == pytest.approx(-numeric.fun, abs=1e-4)
    assert np.allclose(gp.theta, numeric.x, atol=1e-2)
    assert np.all(gp.theta >= THETA_BOUNDS[:, 0]) and np.all(gp.theta <= THETA_BOUNDS[:, 1])


def test_a_kernel_matrix_that_is_not_positive_definite_gives_minus_infinity(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As scikit-learn's GP does, so L-BFGS-B backs off instead of crashing."""
    monkeypatch.setattr(
        gp_module, "tv_squared_exp", lambda *a, **k: (-np.eye(3), np.zeros((3, 3, 3)))
    )
    lml, grad = log_marginal_likelihood(THETA0, np.zeros((3, 3)), np.array([1.0, -1.0, 0.0]))
    assert lml == -np.inf and np.array_equal(grad, np.zeros(3))


def test_posterior_interpolates_and_has_prior_variance_far_away() -> None:
    x, y = gp_data(20)
    gp = fit_gp(x, y, theta=np.log([1.0, 0.5, 0.01]))
    assert np.allclose(gp.mean(x), y, atol=1e-3)
    assert np.all(gp.variance(x) < 1e-3)
    far = np.array([[0.5, 50.0, 50.0]])
    assert gp.mean(far)[0] == pytest.approx(0.0, abs=1e-9)
    assert gp.variance(far)[0] == pytest.approx(1.0)


def test_fit_refuses_non_finite_data() -> None:
    x, y = gp_data(5)
    y[2] = np.inf
    with pytest.raises(gp_module.GPFitError, match="NaN or infinite"):
        fit_gp(x, y)


# -- normalisation and observations -----------------------------------------------
def test_normalize_and_standardize_follow_ray() -> None:
    data = np.array([[0.0, 10.0], [5.0, 20.0], [10.0, 30.0]])
    assert np.allclose(normalize(data, data), [[0, 0], [0.5, 0.5], [1, 1]], atol=1e-8)
    wrt = np.array([[0.0, 0.0], [20.0, 40.0]])  # [low, high] rows, as for bounds
    assert np.allclose(normalize(data, wrt), data / [20, 40], atol=1e-8)
    assert normalize(np.array([3.0]), np.array([[3.0], [3.0]]))[0] == 0.0  # no 0/0
    y = np.array([0.0, 0.0, 0.0, 10.0])
    z = standardize(y)
    assert z[3] == pytest.approx(7.5 / np.std(y))  # 1.73: not clipped ...
    assert standardize(np.array([0.0] * 20 + [100.0]))[-1] == 2.0  # ... but this one is
    assert z[0] == pytest.approx(-2.5 / np.std(y)) and np.isclose(np.mean(standardize(y[:3])), 0)


def test_reward_changes_pair_rows_of_a_trial_with_unchanged_hyperparameters() -> None:
    ids = ["a", "b", "a", "b", "a", "b", "a", "b"]
    rows = np.array(
        [
            [1.0, 0.1, 5.0, 1.0],  # a: first row of its group
            [1.0, 0.2, 5.0, 2.0],
            [2.0, 0.1, 5.0, 4.0],  # a: +3 over 1
            [2.0, 0.2, 5.0, float("nan")],  # NaN reward: no pair, and none after it
            [4.0, 0.1, 5.0, 10.0],  # a: +6 over 2
            [3.0, 0.2, 5.0, 7.0],
            [4.0, 0.3, 5.0, 10.0],  # a, new lr (an exploit row): starts a group
            [3.0, 0.2, 6.0, 8.0],  # b, another categorical value: starts a group
        ]
    )
    changes = reward_changes(ids, rows, gp_columns=[0])
    assert changes.trial_ids == ["a", "a"]
    assert changes.x.tolist() == [[2.0, 1.0, 0.1], [4.0, 4.0, 0.1]]  # [t, r_before, lr]
    assert changes.y.tolist() == [3.0, 3.0]
    assert changes.reward.tolist() == [4.0, 10.0]
    # Δt = 0 gives no observation; the window keeps the latest rows
    same_time = reward_changes(["a", "a"], np.array([[1.0, 0.1, 1.0], [1.0, 0.1, 2.0]]), [0])
    assert len(same_time.y) == 0 and same_time.x.shape == (0, 3)
    many = np.array([[t, 0.5, float(t * t)] for t in range(30)])
    last = reward_changes(["a"] * 30, many, [0], max_rows=5)
    assert last.x[:, 0].tolist() == [25.0, 26.0, 27.0, 28.0, 29.0]


def test_select_length_searches_windows_from_200_in_steps_of_10(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[int] = []

    def fake_fit(x: np.ndarray, y: np.ndarray) -> Any:
        seen.append(len(x))
        return type("GP", (), {"log_marginal_likelihood": -((len(x) - 220) ** 2)})()

    monkeypatch.setattr(gp_module, "fit_gp", fake_fit)
    lows, highs = np.zeros(1), np.ones(1)
    x, y = gp_data(245)
    assert select_length(x, y, lows, highs) == 220
    assert seen == [200, 210, 220, 230, 240]
    assert select_length(x[:199], y[:199], lows, highs) == 199  # below 200: all of them
    seen.clear()
    assert select_length(x[:209], y[:209], lows, highs) == 200 and seen == [200]


def test_select_length_prefers_the_window_the_likelihood_prefers() -> None:
    """Old rows that contradict the recent ones: a shorter window fits better."""
    g = rng(4)
    x = g.uniform(0, 1, (230, 3))
    y = np.where(np.arange(230) < 30, g.normal(0, 3, 230), np.sin(3 * x[:, 2]))
    lows, highs = np.zeros(1), np.ones(1)
    scores = {}
    for length in (200, 210, 220, 230):
        xs, ys = gp_module._scaled(x[-length:], y[-length:], lows, highs)
        scores[length] = fit_gp(xs, ys).log_marginal_likelihood
    assert select_length(x, y, lows, highs) == max(scores, key=scores.get)


# -- UCB --------------------------------------------------------------------------
def test_ucb_kappa_is_ray_beta() -> None:
    assert ucb_kappa(1) == pytest.approx(math.sqrt(0.2))  # ln(0.4) < 0
    assert ucb_kappa(100) == pytest.approx(math.sqrt(0.2 + math.log(40)))


@settings(max_examples=examples(15), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), d=st.integers(1, 3), n=st.integers(2, 25))
def test_ucb_maximum_stays_in_the_unit_box(seed: int, d: int, n: int) -> None:
    x, y = gp_data(n, d=d, seed=seed)
    gp = fit_gp(x, y)
    best = maximise_ucb(gp, gp, np.array([0.5, 0.5]), rng(seed).uniform(0, 1, (3, d)))
    assert best.shape == (d,) and np.all((best >= 0) & (best <= 1))


def test_ucb_finds_the_peak_of_the_reward_change() -> None:
    g = rng(1)
    x = np.column_stack([np.full(60, 0.5), np.full(60, 0.5), g.uniform(0, 1, 60)])
    y = standardize(-((x[:, 2] - 0.7) ** 2))
    gp = fit_gp(x, y)
    best = maximise_ucb(gp, gp, np.array([0.5, 0.5]), g.uniform(0, 1, (10, 1)))
    assert best[0] == pytest.approx(0.7, abs=0.05)


def test_pending_configs_push_the_next_choice_away() -> None:
    """Batch awareness: a config already chosen at this step lowers the variance there."""
    x, y = gp_data(12, seed=2)
    lows, highs = np.array([0.0]), np.array([10.0])
    raw_x = np.column_stack([x[:, :2] * 100, x[:, 2] * 10])
    alone = select_config(raw_x, y, np.empty((0, 1)), raw_x[-1, :2], lows, highs, rng(0))
    pending = np.array([alone, alone])
    second = select_config(raw_x, y, pending, raw_x[-1, :2], lows, highs, rng(0))
    assert lows[0] <= second[0] <= highs[0]
    assert second[0] != pytest.approx(alone[0], abs=1e-3)


# -- validation -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("bounds", "match"),
    [
        (None, r"`hyperparam_bounds` is None, but PB2 needs the \[low, high\] bounds"),
        ({}, r"`hyperparam_bounds` is \{\}, but PB2 needs"),
        ([0.0, 1.0], r"`hyperparam_bounds` is \[0\.0, 1\.0\], but must be a dict"),
        ({"lr": 0.1}, r"`hyperparam_bounds\['lr'\]` is 0\.1 \(type float\), but must be \[low, h"),
        ({"lr": [0.1]}, r"`hyperparam_bounds\['lr'\]` is \[0\.1\] \(type list\), but must be"),
        ({"lr": [0.1, 0.01]}, r"is \[0\.1, 0\.01\], but must be \[low, high\] with low < high"),
        ({"lr": (0.1, 0.1)}, r"is \(0\.1, 0\.1\), but must be \[low, high\] with low < high"),
        ({"lr": [0.0, math.inf]}, r"is \[0\.0, inf\], but its bounds must be finite numbers"),
        ({"opt": ["adam", "sgd"]}, r"must be \[low, high\] of numbers \(for two categories use"),
        ({"flag": [False, True]}, r"`hyperparam_bounds\['flag'\]` is \[False, True\], but a two"),
        ({"opt": {"lr": [1, 0]}}, r"`hyperparam_bounds\['opt/lr'\]` is \[1, 0\], but must be"),
        ({"opt": {}}, r"`hyperparam_bounds\['opt'\]` is an empty dict, but nested bounds"),
        ({"x": randn()}, r"`hyperparam_bounds\['x'\]` is Normal\(.*\), which has no bounds"),
        ({"x": sample_from(lambda spec: 1)}, r"`hyperparam_bounds\['x'\]` is SampleFrom"),
        ({"n": randint(3, 4)}, r"`hyperparam_bounds\['n'\]` is RandInt.*low = 3, high = 3"),
    ],
)
def test_invalid_bounds_are_named(bounds: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PB2(hyperparam_bounds=bounds)


def test_other_arguments_are_validated_as_pbt_does() -> None:
    with pytest.raises(ValueError, match=r"`quantile_fraction` is 0\.7, but must be between 0"):
        PB2(hyperparam_bounds={"lr": [0, 1]}, quantile_fraction=0.7)
    with pytest.raises(ValueError, match=r"`perturbation_interval` is 0, but must be > 0"):
        PB2(hyperparam_bounds={"lr": [0, 1]}, perturbation_interval=0)
    with pytest.raises(ValueError, match=r"`mode` is 'maximise', but must be 'min' or 'max'"):
        PB2(hyperparam_bounds={"lr": [0, 1]}, mode="maximise")
    with pytest.raises(ValueError, match=r"`custom_explore_fn` is 1, but must be a callable"):
        PB2(hyperparam_bounds={"lr": [0, 1]}, custom_explore_fn=1)


def test_a_continuous_value_must_be_a_number() -> None:
    pb2 = make_pb2()
    with pytest.raises(ValueError, match=r"trial t0 config has `lr` = 'fast', but PB2 needs a"):
        pb2.on_trial_add(Trial("t0", {"lr": "fast", "layers": 2}))
    with pytest.raises(ValueError, match=r"lacks mutation keys \['layers'\]"):
        pb2.on_trial_add(Trial("t0", {"lr": 0.1}))


def test_ray_defaults_and_imports() -> None:
    import popflow
    import popflow.schedulers
    from popflow.tune.schedulers import PB2 as FromRayNamespace
    from popflow.tune.schedulers.pb2 import PB2 as FromRayModule

    assert popflow.PB2 is popflow.schedulers.PB2 is FromRayNamespace is FromRayModule is PB2
    pb2 = PB2(hyperparam_bounds={"lr": [0.0, 1.0]})
    assert (pb2.time_attr, pb2.metric, pb2.mode, pb2.synchronous) == (
        "time_total_s",
        None,
        None,
        False,
    )
    assert pb2.next_milestone(Trial("t0", {"lr": 0.5})) == 60.0
    assert (
        pb2.logs_policy and not PB2(hyperparam_bounds={"lr": [0, 1]}, log_config=False).logs_policy
    )


# -- bounds: domains, nesting, categories, initial values ----------------------------
def test_search_space_domains_are_read_as_bounds() -> None:
    """Ray issue 20923: the search space itself passed as the bounds."""
    bounds = {
        "lr": qloguniform(1e-4, 1e-1, 1e-5),
        "warmup": loguniform(1e-5, 1e-3),
        "epochs": qrandint(3, 15, 3),
        "layers": randint(1, 5),
        "batch_size": grid_search([16, 32, 64, 128]),
        "act": choice(["relu", "tanh"]),
        "wd": uniform(0.0, 0.1),
    }
    pb2 = PB2(hyperparam_bounds=bounds, rng=rng())
    by_name = {p.name: p for p in pb2._params}
    assert (by_name["lr"].low, by_name["lr"].high) == (1e-4, 1e-1)
    assert (by_name["epochs"].low, by_name["epochs"].high) == (3, 15)
    assert (by_name["layers"].low, by_name["layers"].high) == (1, 4)  # upper excluded
    assert by_name["batch_size"].categories == (16, 32, 64, 128)
    assert by_name["act"].categories == ("relu", "tanh")
    config = pb2.complete_config({})
    assert 1e-4 <= config["lr"] <= 1e-1 and type(config["layers"]) is int
    assert config["epochs"] % 3 == 0 and config["act"] in ("relu", "tanh")
    assert config["batch_size"] in (16, 32, 64, 128)


def test_complete_config_samples_missing_values_uniformly_in_the_bounds() -> None:
    pb2 = PB2(
        hyperparam_bounds={"lr": [1e-4, 1e-1], "opt": {"mom": [0.8, 0.99]}, "bs": [8, 16, 32]},
        rng=rng(),
    )
    config = {"lr": 0.5, "other": 1}  # a given value stays, even outside the bounds
    filled = pb2.complete_config(config)
    assert config == {"lr": 0.5, "other": 1}
    assert filled["lr"] == 0.5 and filled["other"] == 1
    assert 0.8 <= filled["opt"]["mom"] <= 0.99 and filled["bs"] in (8, 16, 32)
    draws = [pb2.complete_config({})["lr"] for _ in range(200)]
    assert min(draws) < 0.01 and max(draws) > 0.09  # uniform, not log-uniform (Ray)


def test_type_keeping() -> None:
    typed = pb2_module._typed
    assert typed(3, 4.6, 1, 8) == 5 and type(typed(3, 4.6, 1, 8)) is int
    assert typed(3, 8.0, 1.5, 7.6) == 7  # rounded inside the bounds
    assert typed(3, 1.2, 1.5, 7.6) == 2
    assert typed(np.int64(3), 2.4, 1, 8) == 2
    assert typed(0.5, 0.25, 0, 1) == 0.25 and type(typed(0.5, 1, 0, 1)) is float
    assert typed(0.5, 1.5, 0, 1) == 1.0  # clipped to the bounds


# -- the scheduler, driving the real driver on the simulated backend ----------------------------------------
BOUNDS = {"lr": [0.0, 0.1], "layers": [1, 8]}


def make_pb2(**kwargs: Any) -> PB2:
    args: dict[str, Any] = {
        "time_attr": "training_iteration",
        "metric": "score",
        "mode": "max",
        "perturbation_interval": 2,
        "hyperparam_bounds": BOUNDS,
        "quantile_fraction": 0.5,
        "synch": True,
        "rng": rng(0),
    }
    args.update(kwargs)
    return PB2(**args)


def run_pb2(
    pb2: PB2,
    configs: list[dict[str, Any]],
    stop_at: int = 12,
    swap_after: int | None = None,
    reward: Any = gain,
    seed: int = 1,
) -> SimulatedRun:
    """Synch rounds of the real driver on the simulated backend: trial ``t<i>`` starts
    with ``configs[i]`` and its score grows by ``reward(config, iteration, i)`` each
    iteration, the score in its checkpoint; an exploit clones the source's. After
    ``swap_after`` results the driver's scheduler is replaced by a fresh one restored
    from a JSON round trip of its state.

    The driver draws PB2's choices from the experiment's generator (by ``seed``): seed 1
    gives the sources the first test below describes (seed 0 has both t = 4 exploits
    clone the one trial cloned at t = 2)."""
    trainable = type("Gaining", (Gaining,), {"reward": staticmethod(reward)})
    return simulated(
        trainable,
        space_of(configs),
        pb2,
        stop={"training_iteration": stop_at},
        swap_after=swap_after,
        fresh=lambda: make_pb2(rng=rng(12345)),  # its own generator state is overwritten
        seed=seed,
    )


CONFIGS = [
    {"lr": lr, "layers": layers} for lr, layers in [(0.01, 2), (0.03, 7), (0.05, 4), (0.09, 1)]
]


def exploits(backend: SimulatedRun) -> list[Exploit]:
    return backend.decided_exploits


KEEP = "keep (no GP data yet)"


def test_a_synch_run_uses_the_gp_once_the_source_has_observations() -> None:
    backend = run_pb2(make_pb2(), CONFIGS)
    done = exploits(backend)
    assert len(done) == 2 * 5  # two bottom trials at each of the barriers 2, 4, ..., 10
    # At t = 2 no trial has an observation (a pair of rows): the source's values are
    # kept, as in Ray. Nor has a clone of that round at t = 4, its h having changed.
    assert [ex.target_iteration for ex in done if ex.operations["lr"] == KEEP] == [2, 2, 4]
    for ex in done:
        if ex.operations["lr"] == KEEP:
            assert ex.new_config == ex.source_config
            continue
        assert ex.operations == {"lr": "gp-ucb", "layers": "gp-ucb"}
        assert 0.0 <= ex.new_config["lr"] <= 0.1
        assert type(ex.new_config["layers"]) is int and 1 <= ex.new_config["layers"] <= 8
    assert len({ex.new_config["lr"] for ex in done}) > 3
    assert all(t.status == TrialStatus.TERMINATED for t in backend.trials.values())


def test_every_perturbation_point_and_gp_exploit_logs_a_data_row() -> None:
    pb2 = make_pb2()
    backend = run_pb2(pb2, CONFIGS, stop_at=7)
    state = pb2.get_state()["pb2"]
    rows, row_trials = state["rows"], state["row_trials"]
    chosen = [ex for ex in exploits(backend) if ex.operations["lr"] == "gp-ucb"]
    assert len(chosen) == 3
    assert len(rows) == 4 * 3 + len(chosen)  # 4 trials x barriers 2, 4, 6; one per choice
    logged = [(tid, row) for tid, row in zip(row_trials, rows, strict=True)]
    for ex in chosen:
        t = float(ex.target_iteration)  # synch: the source is at the same time
        source = next(row for tid, row in logged if tid == ex.source_trial_id and row[0] == t)
        # the target restarts from the source's (t, r) with its new h
        expected = [t, ex.new_config["lr"], float(ex.new_config["layers"]), source[-1]]
        assert (ex.trial_id, expected) in logged
    # batch awareness: both configs chosen at t = 6 are pending, in order
    last_round = exploits(backend)[-2:]
    assert state["current"] == [
        [ex.new_config["lr"], float(ex.new_config["layers"])] for ex in last_round
    ]
    assert state["last_exploration_time"] == 6.0


def test_mode_min_logs_negated_rewards() -> None:
    pb2 = make_pb2(mode="min")
    trial = Trial("t0", {"lr": 0.05, "layers": 3})
    pb2.on_trial_add(trial)
    pb2.on_trial_result(trial, {"training_iteration": 2, "score": 1.5})
    assert pb2.get_state()["pb2"]["rows"] == [[2.0, 0.05, 3.0, -1.5]]


def test_same_seed_same_decisions_and_a_new_seed_differs() -> None:
    runs = []
    for seed in (7, 7, 8):
        backend = run_pb2(make_pb2(rng=rng(seed)), CONFIGS, seed=seed)
        runs.append(backend.decided)
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


@pytest.mark.parametrize("cut", [2, 8, 18, 28, 36])  # each iteration reports: 48 results
def test_state_round_trip_mid_run_gives_identical_decisions(cut: int) -> None:
    """Snapshot after any result (mid-round too), restore into a fresh PB2, go on."""
    uninterrupted = run_pb2(make_pb2(), CONFIGS)
    resumed = run_pb2(make_pb2(), CONFIGS, swap_after=cut)
    assert resumed.decided == uninterrupted.decided
    assert json.dumps(resumed.scheduler.get_state()) == json.dumps(
        uninterrupted.scheduler.get_state()
    )


def test_state_is_strict_json_with_non_finite_rewards() -> None:
    pb2 = make_pb2()
    trials = [Trial(f"t{i}", {"lr": 0.05, "layers": 2}) for i in range(2)]
    for t in trials:
        pb2.on_trial_add(t)
    pb2.on_trial_result(trials[0], {"training_iteration": 2, "score": float("nan")})
    pb2.on_trial_result(trials[1], {"training_iteration": 2, "score": float("inf")})
    state = json.loads(json.dumps(pb2.get_state()))
    json.dumps(state["pb2"], allow_nan=False)  # PB2's own part is strict JSON
    restored = make_pb2()
    restored.set_state(state)
    rows = restored.get_state()["pb2"]["rows"]
    assert rows[0][-1] == "nan" and rows[1][-1] == "inf"
    assert math.isnan(restored._rows[0][-1]) and restored._rows[1][-1] == math.inf


def test_an_infinite_reward_drops_out_of_the_gp_data(caplog: pytest.LogCaptureFixture) -> None:
    """Ray issue 40787's spirit: a diverged trial's infinite reward must not crash the run,
    nor stop the GP for the rest of it."""

    def exploding(config: dict[str, Any], iteration: int, index: int) -> float:
        return math.inf if (index, iteration) == (1, 3) else gain(config, iteration, index)

    with caplog.at_level(logging.WARNING, logger="popflow.schedulers.pb2"):
        backend = run_pb2(make_pb2(), CONFIGS, reward=exploding)
    assert "PB2 could not fit its GP" not in caplog.text
    chosen = [ex for ex in exploits(backend) if ex.operations["lr"] == "gp-ucb"]
    assert chosen and not [ex for ex in exploits(backend) if "fallback" in ex.operations["lr"]]
    assert all(t.status == TrialStatus.TERMINATED for t in backend.trials.values())
    changes = reward_changes(["a", "a", "a"], np.array([[1, 0.1, 1.0], [2, 0.1, np.inf],
                                                          [3, 0.1, 2.0]]), [0])  # fmt: skip
    assert len(changes.y) == 0  # both pairs touch the infinite reward


def test_a_singular_kernel_matrix_falls_back_too(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def singular(*args: Any, **kwargs: Any) -> Any:
        raise LinAlgError("2-th leading minor not positive definite")

    monkeypatch.setattr(gp_module, "fit_gp", singular)
    with caplog.at_level(logging.WARNING, logger="popflow.schedulers.pb2"):
        # seed 2: neither t = 4 source is a clone of t = 2 (both have GP data to fall back from)
        backend = run_pb2(make_pb2(), CONFIGS, stop_at=5, seed=2)
    assert "LinAlgError: 2-th leading minor" in caplog.text
    later = exploits(backend)[2:]
    assert later and all("(GP fallback)" in ex.operations["lr"] for ex in later)


def test_categorical_hyperparameters_use_pbt_explore() -> None:
    bounds = {"lr": [0.0, 0.1], "opt": {"layers": [1, 8], "act": ["relu", "tanh", "gelu"]}}
    configs = [{"lr": c["lr"], "opt": {"layers": c["layers"], "act": "tanh"}} for c in CONFIGS]

    def reward(config: dict[str, Any], iteration: int, index: int) -> float:
        flat = {"lr": config["lr"], "layers": config["opt"]["layers"]}
        return gain(flat, iteration, index) + 0.1 * (config["opt"]["act"] == "gelu")

    # seed 3: neither t = 4 source is a clone of t = 2 (both have GP data)
    backend = run_pb2(make_pb2(hyperparam_bounds=bounds), configs, reward=reward, seed=3)
    later = exploits(backend)[2:]
    assert later
    for ex in later:
        assert ex.operations["lr"] == ex.operations["opt/layers"] == "gp-ucb"
        assert ex.operations["opt/act"] in (
            "shift left",
            "shift right",
            "resample",
        ) or ex.operations["opt/act"].endswith("(noop)")
        assert ex.new_config["opt"]["act"] in ("relu", "tanh", "gelu")
        assert type(ex.new_config["opt"]["layers"]) is int
    # the GP sees lr and layers; rows log act by its index in the list
    rows = backend.scheduler.get_state()["pb2"]["rows"]
    assert {row[3] for row in rows} <= {0.0, 1.0, 2.0} and len(rows[0]) == 5


def test_categorical_only_bounds_need_no_gp() -> None:
    pb2 = make_pb2(hyperparam_bounds={"act": ["relu", "tanh", "gelu"]})
    backend = run_pb2(
        pb2, [{"act": a} for a in ["relu", "tanh", "gelu", "tanh"]], reward=lambda c, i, k: k
    )
    assert exploits(backend) and all(set(ex.operations) == {"act"} for ex in exploits(backend))


def test_custom_explore_fn_runs_last() -> None:
    def halve_layers(config: dict[str, Any]) -> dict[str, Any]:
        return {**config, "layers": max(1, config["layers"] // 2), "seen": True}

    backend = run_pb2(make_pb2(custom_explore_fn=halve_layers), CONFIGS, stop_at=5)
    assert all(ex.new_config["seen"] for ex in exploits(backend))
    with pytest.raises(TypeError, match=r"`custom_explore_fn` returned None"):
        run_pb2(make_pb2(custom_explore_fn=lambda c: None), CONFIGS, stop_at=5)


def test_async_exploit_decides_per_result() -> None:
    pb2 = make_pb2(synch=False)
    trials = [Trial(f"t{i}", dict(c)) for i, c in enumerate(CONFIGS[:2])]
    for t in trials:
        pb2.on_trial_add(t)
    scores = {"t0": [1.0, 2.0, 3.0], "t1": [5.0, 6.5, 8.0]}
    decisions = []
    for step in range(3):
        for t in trials:
            result = {"training_iteration": 2 * (step + 1), "score": scores[t.trial_id][step]}
            decision = pb2.on_trial_result(t, result)
            for ex in decision.exploits:
                t.config = ex.new_config
            decisions.append(decision)
    assert all(d == Action.CONTINUE for d in decisions)
    done = [ex for d in decisions for ex in d.exploits]
    assert [ex.trial_id for ex in done] == ["t0", "t0"]  # from t = 4 on
    assert done[0].operations["lr"] == "keep (no GP data yet)"
    assert done[-1].operations["lr"] == "gp-ucb"
