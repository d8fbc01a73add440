"""How asynchronous dispatch packs short segments into runner calls."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from popflow.flows.packing import PACK_BELOW_SECONDS, pack_size, packs
from popflow.flows.trial_table import TrialRecord
from popflow.schedulers import Trial


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
