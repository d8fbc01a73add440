"""How asynchronous dispatch packs short segments into runner calls and picks runners."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from popflow.flows.backends.runners import Runner, pick_runner
from popflow.flows.driver.packing import PACK_BELOW_SECONDS, pack_size, packs, spread
from popflow.flows.experiment.trial_table import TrialRecord
from popflow.schedulers import Trial

pytestmark = pytest.mark.unit


def test_segments_not_yet_measured_or_long_are_sent_one_a_call():
    assert pack_size(None, 100, 8) == 1
    assert pack_size(PACK_BELOW_SECONDS, 100, 8) == 1
    assert pack_size(5.0, 100, 8) == 1


@given(st.floats(1e-5, PACK_BELOW_SECONDS * 0.999), st.integers(1, 20_000), st.integers(1, 64))
def test_short_segments_fill_a_call_but_leave_every_slot_two_calls(seconds, unfinished, slots):
    size = pack_size(seconds, unfinished, slots)
    assert size >= 1
    assert size <= math.ceil(PACK_BELOW_SECONDS / max(seconds, 1e-4))  # no more work than that
    assert size == 1 or size <= math.ceil(unfinished / (2 * slots))
    if unfinished >= 2 * slots * math.ceil(PACK_BELOW_SECONDS / max(seconds, 1e-4)):
        assert size * max(seconds, 1e-4) >= PACK_BELOW_SECONDS * 0.999  # a call's worth


def record(i: int, worker: str | None) -> TrialRecord:
    rec = TrialRecord(trial=Trial(trial_id=f"t{i}", config={}), index=i, dirname=f"d{i}")
    rec.live = (f"token{i}", worker) if worker else None
    return rec


def test_a_call_holds_trials_parked_on_one_worker_and_fills_up_with_cold_ones():
    recs = [record(0, "w1"), record(1, None), record(2, "w2"), record(3, "w1"), record(4, None)]
    out = packs(recs, 2)
    assert [[r.trial_id for r in p] for p in out] == [["t0", "t3"], ["t2", "t1"], ["t4"]]
    for pack in out:
        assert len({r.live[1] for r in pack if r.live}) <= 1


def runner(worker: str, queued: int) -> Runner:
    return Runner(worker, actor=None, future=None, hold=None, queued=queued)  # type: ignore[arg-type]


def test_a_call_goes_to_the_least_busy_runner_where_its_trainables_are_parked():
    runners = [runner("w1", 2), runner("w1", 1), runner("w2", 0)]
    assert pick_runner(runners, "w1", idle_first=False) is runners[1]  # queued behind one
    assert pick_runner(runners, None, idle_first=False) is runners[2]
    assert pick_runner(runners, "gone", idle_first=False) is runners[2]


def test_time_shared_slots_take_a_free_runner_before_a_busy_one():
    runners = [runner("w1", 1), runner("w2", 0), runner("w2", 1)]
    # parked on busy w1: restored on free w2 rather than queued behind w1's call
    assert pick_runner(runners, "w1", idle_first=True) is runners[1]
    runners.append(runner("w1", 0))
    assert pick_runner(runners, "w1", idle_first=True) is runners[3]  # free where it is parked
    assert pick_runner([runner("w1", 1), runner("w2", 2)], "w2", idle_first=True).queued == 2


def test_a_parked_trainable_moves_only_if_its_latest_checkpoint_holds_its_state():
    rec = record(0, "w1")
    rec.trial.last_result = {"training_iteration": 10}
    rec.restore_iteration = 10
    assert rec.movable  # restored elsewhere from the checkpoint at iteration 10
    rec.trial.last_result = {"training_iteration": 12}
    assert not rec.movable  # iterations 11-12 live only on w1 (no checkpoint since)
    assert record(1, None).movable


def test_a_workers_second_pack_comes_after_every_workers_first():
    """So that a pack its worker's runner would queue goes to an idle runner instead."""
    recs = [record(i, w) for i, w in enumerate(["w1", "w1", "w1", "w2", "w2", "w2"])]
    out = packs(recs, 2)
    assert [[r.trial_id for r in p] for p in out] == [["t0", "t1"], ["t3", "t4"], ["t2"], ["t5"]]


def test_a_suspect_trial_goes_in_a_call_of_its_own():
    recs = [record(0, None), record(1, None), record(2, None)]
    out = packs(recs, 3, alone={"t1"})
    assert [[r.trial_id for r in p] for p in out] == [["t0", "t2"], ["t1"]]


def test_a_synchronous_rounds_packs_reach_slots_that_joined_and_no_pack_grows():
    # 8 trials parked two by two on 4 workers, cut for 4 slots; 2 workers joined since
    recs = [record(i, f"w{i // 2}") for i in range(8)]
    calls = spread(packs(recs, 2), slots=6)
    assert sorted(len(c) for c in calls) == [1, 1, 1, 1, 2, 2]
    assert sorted(r.trial_id for c in calls for r in c) == sorted(r.trial_id for r in recs)
    for call in calls:
        assert len({r.live[1] for r in call if r.live}) == 1  # still one worker's trials


@given(st.integers(1, 40), st.integers(1, 12), st.integers(1, 6), st.integers(1, 12))
def test_spreading_never_lengthens_a_call_nor_loses_a_trial(n, size, workers, slots):
    recs = [record(i, f"w{i % workers}" if i % 3 else None) for i in range(n)]
    before = packs(recs, size)
    after = spread(before, slots)
    assert max(map(len, after)) <= max(map(len, before))
    assert [r.trial_id for c in after for r in c] == [r.trial_id for c in before for r in c]
    assert len(after) >= min(slots, n) or len(after) >= len(before)
    assert len(after) == max(len(before), min(slots, n))
