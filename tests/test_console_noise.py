"""The console at the default verbosity has what a person needs, not a line per scheduler
decision or per HTTP request; ``verbose=3`` shows the decisions. In-process, no cluster:
a script's own ``logging.basicConfig`` handler on the root logger, as the examples have."""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from popflow.flows.console.verbose import console_verbosity
from popflow.schedulers import HyperBandScheduler, PopulationBasedTraining, Trial

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True, scope="module")
def prefect_logging() -> None:
    """Prefect's logging set up first, as a run's record does (it resets the root's level)."""
    from prefect.logging.configuration import setup_logging

    setup_logging()


@contextmanager
def script_console() -> Iterator[io.StringIO]:
    """A root handler at INFO, as ``logging.basicConfig(level=logging.INFO)`` makes."""
    root = logging.getLogger()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    saved = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(saved)


def shown(verbose: int, drive: Callable[[], None]) -> str:
    with script_console() as stream, console_verbosity(verbose):
        drive()
    return stream.getvalue()


def hyperband_promotes() -> None:
    """max_t=9, η=3: 9 trials at r=1, the best 3 promoted to r=3."""
    s = HyperBandScheduler(metric="score", mode="max", max_t=9)
    trials = [Trial(f"t{i}", {}) for i in range(9)]
    for t in trials:
        s.on_trial_add(t)
    for i, t in enumerate(trials):
        s.on_trial_result(t, {"training_iteration": 1, "score": float(i)})


def pbt_skips_an_exploit() -> None:
    """t2 ranks top only after its perturbation point: no checkpoint to clone it from."""
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        metric="score",
        mode="max",
        perturbation_interval=1,
        hyperparam_mutations={"c": [1, 2]},
        rng=np.random.default_rng(0),
    )
    trials = [Trial(f"t{i}", {"c": 1}) for i in range(3)]
    for t in trials:
        pbt.on_trial_add(t)
    pbt.on_trial_result(trials[0], {"training_iteration": 1, "score": 5.0})
    pbt.on_trial_result(trials[1], {"training_iteration": 1, "score": 1.0})
    pbt.on_trial_result(trials[2], {"training_iteration": 1, "score": 0.0})  # ranks last
    # t2 jumps to the top between its perturbation points; t1, now last, picks from the top
    pbt.on_trial_result(trials[2], {"training_iteration": 1, "score": 99.0})
    for it in range(2, 12):
        pbt.on_trial_result(trials[1], {"training_iteration": it, "score": -float(it)})


@pytest.mark.parametrize(
    ("drive", "decision"),
    [
        (hyperband_promotes, "promoted to rung 1"),
        (pbt_skips_an_exploit, "[pbt]: no checkpoint for trial"),
    ],
)
def test_scheduler_decisions_reach_the_console_at_verbose_3_only(drive, decision):
    assert decision in shown(3, drive)
    assert decision not in shown(2, drive)
    assert decision not in shown(1, drive)


def test_prefects_http_requests_never_reach_the_console():
    """Prefect's client logs each request at INFO on ``httpx`` (``csrf-token ... 422``
    among them): 20-27 lines per example run, at any verbosity."""

    def request() -> None:
        logging.getLogger("httpx").info('HTTP Request: GET http://127.0.0.1:1/api "200 OK"')

    for verbose in (2, 3):
        assert "HTTP Request" not in shown(verbose, request)


def test_a_users_own_http_log_level_is_kept():
    httpx = logging.getLogger("httpx")
    saved = httpx.level
    httpx.setLevel(logging.INFO)
    try:
        out = shown(2, lambda: httpx.info("HTTP Request: GET /api"))
    finally:
        httpx.setLevel(saved)
    assert "HTTP Request" in out


def test_budgets_print_rounded_for_people():
    """HyperBand with max_t=10, η=3: the first bracket's rungs are at 10/9, 10/3 and 10;
    the console says r=3.333 (it said r=3.3333333333333335)."""

    def promotes() -> None:
        s = HyperBandScheduler(metric="score", mode="max", max_t=10)
        trials = [Trial(f"t{i}", {}) for i in range(9)]
        for t in trials:
            s.on_trial_add(t)
        for i, t in enumerate(trials):
            s.on_trial_result(t, {"training_iteration": 2, "score": float(i)})
        assert "r=3.333)" in s.debug_string()

    assert "promoted to rung 1 (r=3.333)" in shown(3, promotes)
