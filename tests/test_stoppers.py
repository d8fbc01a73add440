"""Ray's stoppers: their decisions, their state across a resume, and their use as ``stop``."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.examples import examples
from trainables import FlakyTrainable

from popflow import CheckpointConfig, run
from popflow.tune.stopper import (
    CombinedStopper,
    ExperimentPlateauStopper,
    FunctionStopper,
    MaximumIterationStopper,
    NoopStopper,
    Stopper,
    TimeoutStopper,
    TrialPlateauStopper,
)


@pytest.mark.unit
def test_maximum_iteration_counts_each_trials_results():
    s = MaximumIterationStopper(2)
    assert [s("a", {}), s("b", {}), s("a", {}), s("b", {})] == [False, False, True, True]
    assert not s.stop_all()


@pytest.mark.unit
def test_trial_plateau_waits_for_grace_and_window_then_compares_std():
    s = TrialPlateauStopper("m", std=0.01, num_results=3, grace_period=4)
    assert [s("t", {"m": 1.0}) for _ in range(4)] == [False, False, False, True]
    s = TrialPlateauStopper("m", std=0.01, num_results=2, grace_period=1)
    assert [s("t", {"m": v}) for v in (1.0, 2.0, 2.0)] == [False, False, True]


@pytest.mark.unit
def test_trial_plateau_with_a_threshold_stops_only_once_good_enough():
    s = TrialPlateauStopper("m", num_results=2, grace_period=2, metric_threshold=0.5, mode="min")
    assert [s("t", {"m": v}) for v in (0.9, 0.9, 0.4, 0.4)] == [False, False, False, True]
    with pytest.raises(ValueError, match="`mode` must be 'min' or 'max'"):
        TrialPlateauStopper("m", metric_threshold=1.0)


@pytest.mark.unit
def test_experiment_plateau_stops_all_once_the_top_values_agree():
    s = ExperimentPlateauStopper("m", std=0.001, top=2, mode="max", patience=1)
    decisions = [s("t", {"m": v}) for v in (1.0, 5.0, 5.0, 5.0)]
    assert decisions == [False, False, True, True] and s.stop_all()  # the top two agree
    with pytest.raises(ValueError, match="`top` is 1"):
        ExperimentPlateauStopper("m", top=1)


@pytest.mark.unit
def test_timeout_counts_only_the_time_it_is_asked_over():
    s = TimeoutStopper(datetime.timedelta(seconds=0))
    assert s.stop_all()
    s = TimeoutStopper(3600)
    assert not s.stop_all() and not s("t", {})
    s.set_state({"budget": -1.0})  # resumed after its budget was spent
    assert s.stop_all()
    with pytest.raises(ValueError, match="`timeout` must be"):
        TimeoutStopper("soon")


@pytest.mark.unit
def test_combined_and_function_stoppers():
    s = CombinedStopper(FunctionStopper(lambda tid, r: r["m"] > 1), NoopStopper())
    assert [s("t", {"m": 0}), s("t", {"m": 2})] == [False, True] and not s.stop_all()
    with pytest.raises(TypeError, match="takes Stoppers"):
        CombinedStopper(lambda tid, r: True)


def make_stopper(kind: int) -> Stopper:
    return [
        lambda: MaximumIterationStopper(3),
        lambda: TrialPlateauStopper("m", std=0.2, num_results=2, grace_period=2),
        lambda: ExperimentPlateauStopper("m", std=0.2, top=3, mode="min", patience=1),
        lambda: CombinedStopper(
            MaximumIterationStopper(5), TrialPlateauStopper("m", std=0.2, num_results=3)
        ),
    ][kind]()


@pytest.mark.unit
@settings(max_examples=examples(200), deadline=None)
@given(
    st.integers(0, 3),
    st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from([0.0, 0.1, 0.5, 1.0])), max_size=20),
    st.integers(0, 20),
)
def test_a_stopper_restored_from_its_state_decides_as_if_never_stopped(kind, stream, cut):
    """What a resume relies on: the committed state (JSON) carries every decision."""
    import json

    whole, first = make_stopper(kind), make_stopper(kind)
    expected = [(whole(t, {"m": v}), whole.stop_all()) for t, v in stream]
    got = [(first(t, {"m": v}), first.stop_all()) for t, v in stream[:cut]]
    resumed = make_stopper(kind)
    resumed.set_state(json.loads(json.dumps(first.get_state())))
    got += [(resumed(t, {"m": v}), resumed.stop_all()) for t, v in stream[cut:]]
    assert got == expected


class StopAllAfter(Stopper):
    """Ends the experiment after ``n`` results in all (a user's own stopper)."""

    def __init__(self, n: int) -> None:
        self.n, self.seen = n, 0

    def __call__(self, trial_id, result):
        self.seen += 1
        return False

    def stop_all(self):
        return self.seen >= self.n


@pytest.mark.integration
def test_a_stopper_as_stop_ends_trials_and_the_experiment(tune_env):
    results = run(
        FlakyTrainable,
        {"x": 1},
        stop=MaximumIterationStopper(4),
        num_samples=2,
        name="max-iter",
        **tune_env,
    )
    assert [r.metrics["training_iteration"] for r in results] == [4, 4]
    assert {r.status for r in results} == {"TERMINATED"}
    ended = run(
        FlakyTrainable,
        {"x": 1},
        stop=CombinedStopper(StopAllAfter(6), MaximumIterationStopper(10_000)),
        checkpoint_config=CheckpointConfig(checkpoint_frequency=1),
        num_samples=2,
        name="stop-all",
        **tune_env,
    )
    assert {r.status for r in ended} == {"TERMINATED"}
    # not 20,000 (a trial may not have started before stop_all: no metrics)
    assert sum(r.metrics.get("training_iteration", 0) for r in ended) < 100
