"""A scheduler or searcher refuses a size it would spend time or memory in proportion
to, in its constructor, naming the argument, its value and the range (issue 46, break 9:
``ASHAScheduler(max_t=4, grace_period=1, brackets=10**9)`` looped building 10**9
brackets; HyperBand's exact plan with ``max_t=1e18, reduction_factor=1.05`` ran for
minutes; BOHB drew ``num_samples`` candidates per suggestion, any number of them)."""

from __future__ import annotations

import logging
import math
import re
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from popflow import ASHAScheduler, HyperBandScheduler, uniform
from popflow.schedulers.async_hyperband import rung_milestones
from popflow.schedulers.hb_bohb import HyperBandForBOHB
from popflow.schedulers.search.bohb import TuneBOHB

pytestmark = pytest.mark.unit


def test_asha_refuses_a_billion_brackets_at_once():
    started = time.monotonic()
    with pytest.raises(
        ValueError,
        match=r"^`brackets` is 1000000000, but must be between 1 and 1,000 \(with max_t=4, "
        r"grace_period=1, reduction_factor=4 only the first 2 have rungs",
    ):
        ASHAScheduler(max_t=4, grace_period=1, brackets=10**9)
    assert time.monotonic() - started < 1


@given(
    brackets=st.integers(min_value=1001, max_value=10**30),
    max_t=st.floats(min_value=1, max_value=1e6),
    reduction_factor=st.floats(min_value=1.5, max_value=10),
)
def test_asha_refuses_any_count_past_the_bound(brackets, max_t, reduction_factor):
    with pytest.raises(ValueError, match=rf"^`brackets` is {brackets}, but must be between 1"):
        ASHAScheduler(
            max_t=max_t, grace_period=1, reduction_factor=reduction_factor, brackets=brackets
        )


@given(
    brackets=st.integers(min_value=1, max_value=8),
    exponent=st.integers(min_value=0, max_value=8),
    reduction_factor=st.sampled_from([2, 3, 4]),
)
def test_asha_takes_every_count_up_to_its_rungs_and_builds_rays_brackets(
    brackets, exponent, reduction_factor
):
    max_t = reduction_factor**exponent
    scheduler = ASHAScheduler(
        max_t=max_t, grace_period=1, reduction_factor=reduction_factor, brackets=brackets
    )
    for s in range(brackets):
        assert scheduler.milestones(s) == sorted(rung_milestones(1, max_t, reduction_factor, s))


def test_asha_warns_of_brackets_without_rungs_and_still_builds_them(caplog):
    with caplog.at_level(logging.WARNING, logger="popflow.schedulers.async_hyperband"):
        scheduler = ASHAScheduler(max_t=4, grace_period=1, brackets=5)
    assert "brackets=5, but only 2 have rungs" in caplog.text
    assert [scheduler.milestones(s) for s in range(5)] == [[1, 4], [4], [], [], []]  # Ray's
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="popflow.schedulers.async_hyperband"):
        ASHAScheduler(max_t=4, grace_period=1, brackets=2)
    assert not caplog.text


def test_asha_says_too_many_rungs_where_the_ratio_overflows():
    # max_t / grace_period is inf: floor(log(inf)) raised OverflowError
    with pytest.raises(ValueError, match=r"^`reduction_factor` is 2 with `max_t` 1e\+300 "):
        ASHAScheduler(max_t=1e300, grace_period=1e-300, reduction_factor=2)


@pytest.mark.parametrize("cls", [HyperBandScheduler, HyperBandForBOHB])
@pytest.mark.parametrize(
    ("max_t", "reduction_factor", "brackets"),
    [(1e18, 1.05, "850"), (2**999, 2, "1,000"), (1.1, 1.0001, "954"), (2**100, 2, "101")],
)
def test_hyperband_refuses_a_plan_of_more_than_100_brackets(cls, max_t, reduction_factor, brackets):
    started = time.monotonic()
    with pytest.raises(
        ValueError,
        match=rf"^`reduction_factor` is {reduction_factor} with `max_t` .*: that makes "
        rf"{brackets} HyperBand brackets .* but popflow allows at most 100",
    ):
        cls(max_t=max_t, reduction_factor=reduction_factor)
    assert time.monotonic() - started < 1


def test_hyperband_takes_a_plan_of_100_brackets_quickly():
    started = time.monotonic()
    scheduler = HyperBandScheduler(max_t=2**99, reduction_factor=2)
    assert len(scheduler._plan) == 100  # s_max = 99
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("num_samples", [10**9, 1e300, math.inf])
def test_bohb_refuses_more_candidates_per_suggestion_than_10000(num_samples):
    with pytest.raises(
        ValueError,
        match=rf"^`num_samples` is {re.escape(repr(num_samples))}, but must be a number in \[1, 10000\]",
    ):
        TuneBOHB(
            {"x": uniform(0, 1)}, bohb_config={"num_samples": num_samples}, metric="y", mode="max"
        )
    TuneBOHB({"x": uniform(0, 1)}, bohb_config={"num_samples": 10_000}, metric="y", mode="max")
