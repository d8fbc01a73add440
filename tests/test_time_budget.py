"""Time budgets end runs on time, whatever the trials do (issue 44, item 2).

Ray's stopping guide (tune-stopping, ``doc_code/stopping.py``): a function trainable that
reports every second for ever, stopped by ``stop={"time_total_s": 5}`` (each trial) and by
``TuneConfig(time_budget_s=5.0)`` (the experiment); each asserts fewer than 8 iterations.
The budget ends the experiment as Ray's ``TimeoutStopper`` does: the segment in flight ends
at its next report, its reports are kept and the trial is TERMINATED.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

import popflow
from popflow import tune
from popflow.flows.backends.segment_watch import SegmentWatch
from popflow.flows.driver.clock import VirtualClock
from popflow.flows.driver.early_end import EarlyEnd
from popflow.tune import Tuner


def my_trainable(config):  # the guide's, as stopping.py has it
    i = 1
    while True:
        time.sleep(1)
        tune.report({"mean_accuracy": min(i / 10, 1.0)})
        i += 1


@pytest.mark.integration
def test_time_total_s_stops_a_trial_whose_function_never_returns(initialised, tmp_path):
    began = time.monotonic()
    tuner = tune.Tuner(
        my_trainable,
        run_config=tune.RunConfig(
            name="by_time", storage_path=str(tmp_path), stop={"time_total_s": 5}, verbose=0
        ),
    )
    result_grid = tuner.fit()
    assert time.monotonic() - began < 20
    (result,) = result_grid
    assert 5 <= result.metrics["training_iteration"] < 8
    assert result.metrics["time_total_s"] >= 5  # the report that reached it ends the trial
    assert result.status == "TERMINATED"


@pytest.mark.integration
def test_time_budget_ends_the_experiment_on_time_keeping_its_reports(initialised, tmp_path):
    began = time.monotonic()
    tuner = tune.Tuner(
        my_trainable,
        tune_config=tune.TuneConfig(time_budget_s=5.0),
        run_config=tune.RunConfig(name="budget", storage_path=str(tmp_path), verbose=0),
    )
    result_grid = tuner.fit()
    assert time.monotonic() - began < 20
    (result,) = result_grid
    # the segment in flight ended at its first report past the budget: those are kept
    assert 4 <= result.metrics["training_iteration"] < 8
    assert len(result.metrics_dataframe) == result.metrics["training_iteration"]
    assert result.status == "TERMINATED"  # Ray's: the experiment is over
    # as Ray's: a restore of an experiment its budget ended runs nothing more
    again = Tuner.restore(result_grid.experiment_path, my_trainable).fit()
    assert [r.metrics["training_iteration"] for r in again] == [
        result.metrics["training_iteration"]
    ]


def counting_reporter(config):
    """Reports for ever, each report a line in ``config["log"]`` (to see when it ends)."""
    while True:
        time.sleep(0.5)
        with open(config["log"], "a") as f:
            f.write("report\n")
        tune.report({"score": 1})


@pytest.mark.integration
def test_run_budget_ends_the_run_on_time_resumably_and_frees_the_slot(tune_env, tmp_path):
    """popflow's budget of one run: the experiment stays resumable, and the function in
    flight ends at the budget too (its reports are taken: the next run goes on from
    them), so its slot is free."""
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    began = time.monotonic()
    grid = popflow.run(
        counting_reporter, {"log": str(first)}, name="first", run_budget_s=3, verbose=0, **tune_env
    )
    assert time.monotonic() - began < 20
    assert [r.status for r in grid] == ["PENDING"] and Tuner.can_restore(grid.experiment_path)
    assert [len(r.history) > 0 for r in grid] == [True]  # the segment ended at the budget's
    reports = len(first.read_text().splitlines())
    popflow.run(  # at least 3 s more, in which the first function must not report on
        counting_reporter,
        {"log": str(second)},
        name="second",
        run_budget_s=3,
        verbose=0,
        **tune_env,
    )
    assert len(first.read_text().splitlines()) <= reports + 1
    assert second.read_text()  # and the second run had a slot to train in


@pytest.mark.unit
@pytest.mark.parametrize("typical", [None, 0.0, 2.5])
def test_the_hang_warning_says_what_it_knows_of_the_average(typical, caplog):
    watch = SegmentWatch(None)
    now = time.monotonic()
    watch.look({1: now - 3600}, lambda c: "t1", lambda c: "w1", typical, lambda w: None)
    (line,) = [r.getMessage() for r in caplog.records]
    if typical is None:
        assert "no segment has returned yet" in line and "on average" not in line
    else:
        assert f"segments take {typical:.1f} s on average" in line


def early_end(clock: VirtualClock, **budgets: float | None) -> EarlyEnd:
    spec = SimpleNamespace(
        fail_fast=False, stop=None, time_budget_s=None, run_budget_s=None, max_rounds=None
    )
    for name, value in budgets.items():
        setattr(spec, name, value)
    return EarlyEnd(spec, {}, clock)  # type: ignore[arg-type]


@pytest.mark.unit
def test_rays_budget_ends_the_experiment_and_popflows_the_run_on_the_drivers_clock():
    clock = VirtualClock(start=1000.0)
    clock.advance_to(3.0)
    ray = early_end(clock, time_budget_s=5.0)
    assert (ray.end_by, ray.wake_at()) == (1008.0, 8.0)  # segments' deadline; the driver's
    clock.advance_to(ray.wake_at())  # a backend waits until then, and no longer
    assert ray.due and ray.timed_out() and not ray.over_budget()
    assert ray.why == "time_budget_s=5 reached" and ray.wake_at() is None

    run = early_end(clock, run_budget_s=2.0, time_budget_s=7.0)
    # segments end at the first budget's end: here the run's, which ends no trial
    assert run.wake_at() == clock.now + 2.0 and run.end_by == clock.time() + 2.0
    assert (
        run.run_budget_first
        and not early_end(clock, time_budget_s=1, run_budget_s=2).run_budget_first
    )
    clock.advance_to(run.wake_at())
    assert run.over_budget() and not run.due  # the run ends; the experiment goes on
    run.end_of_budget()
    assert run.ended_by == "run_budget_s=2 spent" and run.wake_at() == clock.now + 5.0
