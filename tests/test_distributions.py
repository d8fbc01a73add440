"""Every distribution of Ray 2.60's ``ray.tune.search.sample``, with Ray's quantization:
``qrandn`` and ``qlograndint`` (new), and the rules the quantized ones share.

Ray's ``Quantized`` sampler snaps the bounds inwards to multiples of ``q``; a quantized
integer domain draws the multiple's index itself (uniformly, or log-uniformly), with
``upper`` included except for ``q=1``; a quantized float is ``np.round(x / q) * q`` of a
draw between the snapped bounds.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import popflow
from popflow import schedulers, tune
from popflow.schedulers.domains import Domain
from popflow.schedulers.search_space import (
    qlograndint,
    qloguniform,
    qrandint,
    qrandn,
    quniform,
)

pytestmark = pytest.mark.unit

SEEDS = st.integers(min_value=0, max_value=2**32 - 1)

#: ray.tune's distributions (ray/tune/__init__.py of Ray 2.60), and grid_search
RAY_NAMES = (
    "choice",
    "grid_search",
    "lograndint",
    "loguniform",
    "qlograndint",
    "qloguniform",
    "qrandint",
    "qrandn",
    "quniform",
    "randint",
    "randn",
    "sample_from",
    "uniform",
)


def draws(domain: Domain, seed: int, n: int = 50) -> list:
    rng = np.random.default_rng(seed)
    return [domain.sample(rng) for _ in range(n)]


def is_multiple(value: float, q: float) -> bool:
    k = value / q
    return abs(k - round(k)) <= 1e-6 * max(1.0, abs(k))


def ray_integer_support(lower: int, upper: int, q: int) -> set[int]:
    """The values Ray 2.60's quantized integer domains sample (its ``_grid_index``)."""
    k_lo, k_hi = -(-lower // q), upper // q
    return {k * q for k in range(k_lo, k_hi + (0 if q == 1 else 1))}


@pytest.mark.parametrize("module", [popflow, tune, schedulers])
def test_every_distribution_of_ray_tune_is_exported(module) -> None:
    for name in RAY_NAMES:
        assert callable(getattr(module, name)), (module.__name__, name)
        assert name in module.__all__, (module.__name__, name)


# -- qrandn ---------------------------------------------------------------------------
@settings(deadline=None)
@given(
    mean=st.floats(-100, 100),
    sd=st.floats(1e-2, 100),
    q=st.sampled_from([0.2, 0.5, 1.0, 3.0, 1e-3]),
    seed=SEEDS,
)
def test_qrandn_is_a_float_multiple_of_q(mean: float, sd: float, q: float, seed: int) -> None:
    for v in draws(qrandn(mean, sd, q), seed):
        assert type(v) is float
        assert math.isfinite(v)
        assert is_multiple(v, q)


def test_qrandn_rounds_a_normal_draw_to_the_nearest_multiple() -> None:
    values = draws(qrandn(10, 2, 0.2), seed=0, n=2000)
    assert abs(np.mean(values) - 10) < 0.2
    assert abs(np.std(values) - 2) < 0.2
    # the same generator's normal draws, rounded as Ray does (np.round(x / q) * q)
    raw = np.random.default_rng(0).normal(10, 2, size=2000)
    assert values == pytest.approx(list(np.round(raw / 0.2) * 0.2))


# -- qlograndint ------------------------------------------------------------------------
@settings(deadline=None)
@given(
    lower=st.integers(1, 10**5),
    width=st.integers(1, 10**5),
    q=st.integers(1, 50),
    seed=SEEDS,
)
def test_qlograndint_within_bounds_and_quantized(lower: int, width: int, q: int, seed: int) -> None:
    upper = lower + width
    support = ray_integer_support(lower, upper, q)
    if not support:
        with pytest.raises(ValueError, match="no multiple of it lies between"):
            qlograndint(lower, upper, q)
        return
    domain = qlograndint(lower, upper, q)
    assert (domain.first, domain.last) == (min(support), max(support))
    for v in draws(domain, seed):
        assert type(v) is int
        assert v in support
        assert lower <= v <= upper and (v < upper or q > 1)


def test_qlograndint_reaches_every_multiple_upper_included_but_for_q_1() -> None:
    assert set(draws(qlograndint(1, 10, 2), seed=0, n=2000)) == {2, 4, 6, 8, 10}
    assert set(draws(qlograndint(1, 5, 1), seed=0, n=2000)) == {1, 2, 3, 4}
    assert set(draws(qlograndint(5, 20, 5), seed=0, n=2000)) == {5, 10, 15, 20}


def test_qlograndint_is_log_uniform_over_the_multiples() -> None:
    # P(k) = log((k + 1) / k) / log(k_hi + 1 / k_lo) over grid indices 1..99
    counts = Counter(draws(qlograndint(10, 990, 10), seed=1, n=20000))
    assert counts[10] / 20000 == pytest.approx(math.log(2) / math.log(100), abs=0.02)
    assert counts[10] > 10 * counts[980]


def test_qlograndint_with_q_1_draws_what_lograndint_draws() -> None:
    assert draws(qlograndint(1, 1000, 1), seed=3) == draws(tune.lograndint(1, 1000), seed=3)


# -- qrandint: Ray 2.60's rule --------------------------------------------------------
@settings(deadline=None)
@given(lower=st.integers(-500, 500), width=st.integers(1, 500), q=st.integers(1, 40))
def test_qrandint_samples_exactly_rays_multiples(lower: int, width: int, q: int) -> None:
    upper = lower + width
    support = ray_integer_support(lower, upper, q)
    if not support:
        with pytest.raises(ValueError):
            qrandint(lower, upper, q)
        return
    domain = qrandint(lower, upper, q)
    assert (domain.first, domain.last) == (min(support), max(support))
    assert set(draws(domain, seed=0, n=40 * len(support) + 50)) == support


def test_qrandint_draws_each_multiple_equally_often() -> None:
    # Ray 2.60 draws the multiple's index: not a rounded draw, whose ends get half weight
    counts = Counter(draws(qrandint(0, 10, 5), seed=0, n=6000))
    for value in (0, 5, 10):
        assert counts[value] / 6000 == pytest.approx(1 / 3, abs=0.03)


def test_qrandint_with_q_1_and_no_room_is_refused() -> None:
    with pytest.raises(ValueError, match="with q=1 `upper` is excluded"):
        qrandint(5, 5)


# -- quantized floats -------------------------------------------------------------------
@settings(deadline=None)
@given(
    lower=st.integers(-100, 100),
    steps=st.integers(1, 40),
    q=st.sampled_from([0.1, 0.2, 0.25, 0.5, 1.0, 2.5]),
    seed=SEEDS,
)
def test_quniform_with_aligned_bounds_stays_on_the_grid(
    lower: int, steps: int, q: float, seed: int
) -> None:
    low, high = lower * q, (lower + steps) * q
    for v in draws(quniform(low, high, q), seed):
        assert low <= v <= high
        assert is_multiple(v, q)


def test_quniform_draws_between_the_snapped_bounds_then_rounds() -> None:
    # Ray: uniform(0.25, 1.0) rounded to 0.25s: the inner multiples twice as often as the ends
    counts = Counter(draws(quniform(0.1, 1.0, 0.25), seed=0, n=12000))
    assert set(counts) == {0.25, 0.5, 0.75, 1.0}
    for value, share in ((0.25, 1 / 6), (0.5, 1 / 3), (0.75, 1 / 3), (1.0, 1 / 6)):
        assert counts[value] / 12000 == pytest.approx(share, abs=0.02)


def test_the_user_guides_quantized_floats() -> None:
    # ray/doc/source/tune/api/search_space.rst
    assert all(3.2 - 1e-9 <= v <= 5.4 + 1e-9 for v in draws(quniform(3.2, 5.4, 0.2), 0))
    assert all(is_multiple(v, 0.2) for v in draws(quniform(3.2, 5.4, 0.2), 0))
    values = draws(qloguniform(1e-4, 1e-1, 5e-5), seed=0, n=500)
    assert all(1e-4 <= v <= 1e-1 and is_multiple(v, 5e-5) for v in values)


def test_qloguniform_below_its_first_multiple_snaps_up_to_it() -> None:
    # Ray's grid index of 1e-4 / 1e-3 rounds up to 1 (never 0: log(0) has no value)
    assert set(draws(qloguniform(1e-4, 2e-3, 1e-3), seed=0, n=500)) == {1e-3, 2e-3}


# -- validation -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: qrandn(0, 0, 0.1), ValueError, "`sd` is 0"),
        (lambda: qrandn(0, 1, 0), ValueError, "`q` is 0"),
        (lambda: qrandn(0, 1, "a"), TypeError, "`q` is 'a'"),
        (lambda: qlograndint(0, 10, 2), ValueError, "`lower` is 0"),
        (lambda: qlograndint(5, 4, 1), ValueError, "must be < `upper`"),
        (lambda: qlograndint(6, 9, 5), ValueError, "no multiple of it lies between"),
        (lambda: qlograndint(1, 10, 1.5), TypeError, "`q` is 1.5"),
        (lambda: qloguniform(1e-4, 1e-3, 1e-2), ValueError, "no multiple of it"),
    ],
)
def test_bad_arguments_are_refused_naming_them(make, error, message) -> None:
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        make()


def test_same_generator_same_values() -> None:
    for domain in (qrandn(0, 1, 0.5), qlograndint(1, 100, 3), qrandint(0, 9, 3)):
        assert draws(domain, seed=7) == draws(domain, seed=7)


def test_a_deployments_json_param_space_names_every_distribution() -> None:
    from popflow.flows.record.deployable import SPACES, decode_space

    assert set(RAY_NAMES) - set(SPACES) == {"sample_from"}  # a function is no JSON
    space = decode_space({"n": {"qrandn": [10, 2, 0.2]}, "k": {"qlograndint": [1, 10, 2]}})
    assert space["n"] == qrandn(10, 2, 0.2)
    assert space["k"] == qlograndint(1, 10, 2)
