"""Search-space domains: bounds, quantization, types, determinism, validation."""

from __future__ import annotations

import doctest
import math
import random
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from popflow.schedulers import search_space
from popflow.schedulers.domains import Domain
from popflow.schedulers.search_space import (
    choice,
    grid_search,
    is_grid_search,
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

pytestmark = pytest.mark.unit

SEEDS = st.integers(min_value=0, max_value=2**32 - 1)
DRAWS = 50


def draws(domain: Domain, seed: int, n: int = DRAWS) -> list:
    rng = np.random.default_rng(seed)
    return [domain.sample(rng) for _ in range(n)]


def is_multiple(value: float, q: float) -> bool:
    k = value / q
    return abs(k - round(k)) <= 1e-6 * max(1.0, abs(k))


# -- bounds and types, over many seeds and arguments -------------------------------
@settings(deadline=None)
@given(
    lower=st.floats(-1e6, 1e6),
    width=st.floats(1e-3, 1e6),
    seed=SEEDS,
)
def test_uniform_within_bounds_and_float(lower: float, width: float, seed: int) -> None:
    upper = lower + width
    for v in draws(uniform(lower, upper), seed):
        assert type(v) is float
        assert lower <= v <= upper


@settings(deadline=None)
@given(
    q=st.sampled_from([0.1, 0.25, 0.5, 1.0, 2.5, 3.0, 1e-3]),
    k=st.integers(-1000, 1000),
    below=st.floats(0.0, 0.99),
    above=st.floats(0.0, 0.99),
    span=st.integers(0, 50),
    seed=SEEDS,
)
def test_quniform_within_bounds_and_quantized(
    q: float, k: int, below: float, above: float, span: int, seed: int
) -> None:
    # Bounds around at least one multiple of q, aligned (below=above=0) or not.
    lower = (k - below) * q
    upper = (k + span + above) * q
    if not lower < upper:
        lower, upper = k * q, (k + 1) * q
    for v in draws(quniform(lower, upper, q), seed):
        assert type(v) is float
        assert lower <= v <= upper
        assert is_multiple(v, q)


@settings(deadline=None)
@given(
    lower=st.floats(1e-8, 1e3),
    ratio=st.floats(1.001, 1e6),
    base=st.sampled_from([10, 2, math.e]),
    seed=SEEDS,
)
def test_loguniform_within_bounds_and_float(
    lower: float, ratio: float, base: float, seed: int
) -> None:
    upper = lower * ratio
    for v in draws(loguniform(lower, upper, base), seed):
        assert type(v) is float
        assert lower <= v <= upper


@settings(deadline=None)
@given(
    q=st.sampled_from([5e-5, 1e-3, 0.1, 1.0, 4.0]),
    k_lower=st.integers(1, 1000),
    span=st.integers(1, 10_000),
    seed=SEEDS,
)
def test_qloguniform_within_bounds_and_quantized(
    q: float, k_lower: int, span: int, seed: int
) -> None:
    lower, upper = k_lower * q, (k_lower + span) * q
    for v in draws(qloguniform(lower, upper, q), seed):
        assert type(v) is float
        assert lower <= v <= upper
        assert is_multiple(v, q)


@settings(deadline=None)
@given(lower=st.integers(-(10**9), 10**9), width=st.integers(1, 10**6), seed=SEEDS)
def test_randint_within_bounds_upper_excluded(lower: int, width: int, seed: int) -> None:
    upper = lower + width
    for v in draws(randint(lower, upper), seed):
        assert type(v) is int
        assert lower <= v < upper


@settings(deadline=None)
@given(
    lower=st.integers(-1000, 1000),
    width=st.integers(0, 1000),
    q=st.integers(1, 50),
    seed=SEEDS,
)
def test_qrandint_within_bounds_and_quantized(lower: int, width: int, q: int, seed: int) -> None:
    upper = lower + width
    if q == 1 and width == 0:  # with q=1 upper is excluded (Ray 2.60): nothing to draw
        with pytest.raises(ValueError, match="with q=1 `upper` is excluded"):
            qrandint(lower, upper, q)
        return
    if (-(-lower // q)) > upper // q:  # no multiple of q in range: rejected eagerly
        with pytest.raises(ValueError, match="no multiple of it lies between"):
            qrandint(lower, upper, q)
        return
    for v in draws(qrandint(lower, upper, q), seed):
        assert type(v) is int
        assert lower <= v <= upper
        assert v < upper or q > 1
        assert v % q == 0


@settings(deadline=None)
@given(
    lower=st.integers(1, 10**6),
    width=st.integers(1, 10**6),
    base=st.sampled_from([10, 2, math.e]),
    seed=SEEDS,
)
def test_lograndint_within_bounds_upper_excluded(
    lower: int, width: int, base: float, seed: int
) -> None:
    upper = lower + width
    for v in draws(lograndint(lower, upper, base), seed):
        assert type(v) is int
        assert lower <= v < upper


@settings(deadline=None)
@given(categories=st.lists(st.integers() | st.text(max_size=3), min_size=1, max_size=8), seed=SEEDS)
def test_choice_returns_a_category(categories: list, seed: int) -> None:
    for v in draws(choice(categories), seed):
        assert v in categories


@settings(deadline=None)
@given(mean=st.floats(-100, 100), sd=st.floats(1e-3, 100), seed=SEEDS)
def test_randn_is_finite_float(mean: float, sd: float, seed: int) -> None:
    for v in draws(randn(mean, sd), seed):
        assert type(v) is float
        assert math.isfinite(v)


# -- distributions: endpoints and shape ----------------------------------------------
def test_randint_excludes_upper_and_reaches_every_value() -> None:
    assert set(draws(randint(0, 3), seed=0, n=300)) == {0, 1, 2}


def test_qrandint_includes_upper() -> None:
    assert set(draws(qrandint(0, 10, 5), seed=0, n=300)) == {0, 5, 10}


def test_qrandint_default_q_is_one_and_upper_excluded() -> None:
    # Ray 2.60: "upper is also inclusive except for q=1 where it's exclusive"
    assert set(draws(qrandint(1, 3), seed=0, n=300)) == {1, 2}


def test_lograndint_excludes_upper() -> None:
    assert set(draws(lograndint(1, 3), seed=0, n=300)) == {1, 2}


def test_quniform_reaches_both_aligned_bounds() -> None:
    assert set(draws(quniform(0, 1, 0.5), seed=0, n=300)) == {0.0, 0.5, 1.0}


def test_quantized_bounds_not_multiples_of_q_snap_inside() -> None:
    # Ray would round 1 -> 0 and 10 -> 12 here; popflow keeps samples in bounds.
    assert set(draws(qrandint(1, 10, 3), seed=0, n=300)) == {3, 6, 9}
    values = set(draws(quniform(0.1, 1.0, 0.25), seed=0, n=300))
    assert values == {0.25, 0.5, 0.75, 1.0}


def test_quantized_floats_never_step_outside_bounds_by_rounding_error() -> None:
    # 3 * 0.1 == 0.30000000000000004 > 0.3 and 3 * 0.3 == 0.8999999999999999 < 0.9
    high = draws(quniform(0.0, 0.3, 0.1), seed=0, n=300)
    assert max(high) == 0.3
    low = draws(quniform(0.9, 1.2, 0.3), seed=0, n=300)
    assert min(low) == 0.9


def test_loguniform_is_uniform_in_log_space() -> None:
    values = np.array(draws(loguniform(1e-4, 1.0), seed=0, n=4000))
    # a quarter of the log range lies below 1e-3
    assert abs(np.mean(values < 1e-3) - 0.25) < 0.03
    assert abs(np.mean(np.log10(values)) - (-2.0)) < 0.05


def test_randn_mean_and_sd() -> None:
    values = np.array(draws(randn(5.0, 2.0), seed=0, n=4000))
    assert abs(values.mean() - 5.0) < 0.1
    assert abs(values.std() - 2.0) < 0.1


def test_choice_reaches_every_category_about_equally() -> None:
    values = draws(choice(["a", "b", "c", "d"]), seed=0, n=4000)
    counts = {c: values.count(c) for c in "abcd"}
    assert all(900 < n < 1100 for n in counts.values()), counts


def test_choice_returns_original_objects_as_copies() -> None:
    categories = [[1, 2], {"x": 1}]
    domain = choice(categories)
    first = domain.sample(np.random.default_rng(0))
    assert first in categories
    first.clear()  # mutating one trial's value ...
    assert categories == [[1, 2], {"x": 1}]  # ... leaves the space alone
    assert domain.categories == ([1, 2], {"x": 1})


def test_choice_accepts_numpy_array_as_python_scalars() -> None:
    v = choice(np.array([1, 2, 3])).sample(np.random.default_rng(0))
    assert type(v) is int


# -- determinism and injected randomness ------------------------------------------------
ALL_DOMAINS = [
    uniform(-1, 1),
    quniform(0, 10, 0.5),
    loguniform(1e-5, 1e-1),
    qloguniform(1e-4, 1e-1, 5e-5),
    randn(0, 1),
    randint(0, 1000),
    qrandint(0, 1000, 10),
    lograndint(1, 10_000),
    choice(list(range(100))),
]


@pytest.mark.parametrize("domain", ALL_DOMAINS, ids=repr)
def test_same_seed_same_samples_other_seed_differs(domain: Domain) -> None:
    assert draws(domain, seed=123) == draws(domain, seed=123)
    assert draws(domain, seed=123) != draws(domain, seed=124)


@pytest.mark.parametrize("domain", ALL_DOMAINS, ids=repr)
def test_sampling_never_touches_global_random_state(domain: Domain) -> None:
    np.random.seed(7)
    random.seed(7)
    np_before, py_before = np.random.get_state(), random.getstate()
    draws(domain, seed=0)
    np_after = np.random.get_state()
    assert random.getstate() == py_before
    assert all(
        np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
        for a, b in zip(np_before, np_after, strict=True)
    )


@pytest.mark.parametrize("domain", ALL_DOMAINS, ids=repr)
def test_every_domain_is_a_frozen_domain(domain: Domain) -> None:
    assert isinstance(domain, Domain)
    with pytest.raises(AttributeError):
        domain.lower = 0  # type: ignore[misc]


def test_kind_flags() -> None:
    assert choice([1, 2]).is_categorical
    assert not choice([1, 2]).is_integer
    for domain in (uniform(0, 1), quniform(0, 1, 0.5), loguniform(1, 2), qloguniform(1, 4, 1)):
        assert not domain.is_categorical and not domain.is_integer
    assert not randn().is_categorical
    for domain in (randint(0, 2), qrandint(0, 2), lograndint(1, 2)):
        assert domain.is_integer and not domain.is_categorical
    assert isinstance(sample_from(lambda: 1), Domain)


# -- sample_from and grid_search ----------------------------------------------------------
def test_sample_from_passes_spec_to_one_argument_function() -> None:
    domain = sample_from(lambda spec: spec["a"] + 1)
    assert domain.sample(np.random.default_rng(0), {"a": 41}) == 42


def test_sample_from_calls_zero_argument_function() -> None:
    assert sample_from(lambda: "x").sample(np.random.default_rng(0)) == "x"


def test_sample_from_without_spec_gets_empty_dict() -> None:
    assert sample_from(lambda spec: dict(spec)).sample(np.random.default_rng(0)) == {}


def test_grid_search_is_rays_marker() -> None:
    marker = grid_search((1, 2, 3))
    assert marker == {"grid_search": [1, 2, 3]}
    assert is_grid_search(marker)
    assert is_grid_search({"grid_search": ["pasted", "json"]})
    assert not is_grid_search({"grid_search": [1], "other": 2})
    assert not is_grid_search([1, 2])


# -- validation ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: uniform(5, 2), ValueError, "`lower` is 5, but must be < `upper` (2)"),
        (lambda: uniform(1, 1), ValueError, "`lower` is 1, but must be < `upper` (1)"),
        (lambda: uniform(0, math.inf), ValueError, "`upper` is inf, but must be finite"),
        (lambda: uniform("0", 1), TypeError, "`lower` is '0', but must be a real number"),
        (lambda: quniform(0, 1, 0), ValueError, "`q` is 0, but must be > 0"),
        (lambda: quniform(0, 1, -0.5), ValueError, "`q` is -0.5, but must be > 0"),
        (
            lambda: quniform(0.1, 0.2, 1),
            ValueError,
            "`q` is 1.0, but no multiple of it lies between `lower` (0.1) and `upper` (0.2)",
        ),
        (lambda: loguniform(0, 1), ValueError, "`lower` is 0, but must be > 0"),
        (lambda: loguniform(-1, 1), ValueError, "`lower` is -1, but must be > 0"),
        (lambda: loguniform(1, 0.5), ValueError, "`lower` is 1, but must be < `upper` (0.5)"),
        (lambda: loguniform(1, 2, base=1), ValueError, "`base` is 1, but must be > 0 and != 1"),
        (lambda: loguniform(1, 2, base=-2), ValueError, "`base` is -2, but must be > 0 and != 1"),
        (lambda: qloguniform(0, 1, 0.1), ValueError, "`lower` is 0, but must be > 0"),
        (lambda: qloguniform(1, 2, 0), ValueError, "`q` is 0, but must be > 0"),
        (lambda: randn(0, 0), ValueError, "`sd` is 0, but must be > 0"),
        (lambda: randint(3, 3), ValueError, "`lower` is 3, but must be < `upper` (3)"),
        (lambda: randint(0.5, 3), TypeError, "`lower` is 0.5, but must be an integer"),
        (lambda: qrandint(4, 3), ValueError, "`lower` is 4, but must be <= `upper` (3)"),
        (lambda: qrandint(0, 3, 0), ValueError, "`q` is 0, but must be > 0"),
        (lambda: qrandint(0, 3, 1.5), TypeError, "`q` is 1.5, but must be an integer"),
        (lambda: lograndint(0, 10), ValueError, "`lower` is 0, but must be > 0"),
        (lambda: lograndint(5, 5), ValueError, "`lower` is 5, but must be < `upper` (5)"),
        (lambda: choice([]), ValueError, "`categories` is empty, but must hold at least one"),
        (lambda: choice("abc"), TypeError, "`categories` is 'abc', but must be an ordered"),
        (lambda: choice({1, 2}), TypeError, "`categories` is {1, 2}, but must be an ordered"),
        (lambda: sample_from(3), TypeError, "`func` is 3, but must be callable"),
        (lambda: grid_search([]), ValueError, "`values` is empty"),
        (lambda: grid_search("ab"), TypeError, "`values` is 'ab', but must be a list"),
    ],
)
def test_invalid_arguments_raise_with_a_specific_message(make, error, message) -> None:
    with pytest.raises(error, match=re.escape(message)):
        make()


def test_integral_floats_are_accepted_for_integer_domains() -> None:
    domain = randint(0, 1e3)
    assert domain.upper == 1000 and type(domain.upper) is int


def test_docstring_examples_run() -> None:
    failures, attempted = doctest.testmod(search_space)
    assert attempted > 0
    assert failures == 0
