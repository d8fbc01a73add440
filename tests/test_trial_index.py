"""The controller's trial index: runnable trials, counts and changed rows kept as statuses
change, equal to a scan of the whole table (which made 10,000 trials quadratic)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.examples import examples

from popflow.flows.driver.trial_index import TrialIndex, started
from popflow.flows.experiment.trial_table import TrialRecord
from popflow.schedulers import FIFOScheduler, Trial, TrialStatus

pytestmark = pytest.mark.unit


def records(n: int) -> list[TrialRecord]:
    return [
        TrialRecord(trial=Trial(trial_id=f"t{i}", config={"i": i}), index=i, dirname=f"d{i}")
        for i in range(n)
    ]


def scanned(recs: list[TrialRecord], ready: set[str], cap: int | None) -> list[str]:
    """The runnable trials as the controller computed them by scanning every record."""
    runnable = [
        r
        for r in recs
        if r.trial.status in (TrialStatus.PENDING, TrialStatus.PAUSED) and r.trial_id in ready
    ]
    if cap is not None:
        room = cap - sum(1 for r in recs if r.trial.is_live and started(r))
        fresh = {id(r) for r in [r for r in runnable if not started(r)][: max(0, room)]}
        runnable = [r for r in runnable if started(r) or id(r) in fresh]
    return [r.trial_id for r in runnable]


@settings(max_examples=examples(200), deadline=None)
@given(
    st.integers(1, 12),
    st.lists(st.tuples(st.integers(0, 11), st.sampled_from(list(TrialStatus))), max_size=40),
    st.sets(st.integers(0, 11)),
    st.one_of(st.none(), st.integers(0, 6)),
)
def test_the_index_equals_a_scan_of_the_table(n, changes, not_ready, cap):
    recs = records(n)
    index = TrialIndex(recs)
    for i, status in changes:
        rec = recs[i % n]
        rec.trial.status = status
        if status == TrialStatus.RUNNING:
            rec.num_results += 1  # it ran
    ready = {r.trial_id for r in recs} - {f"t{i}" for i in not_ready}
    view = index.runnable(lambda tid: tid in ready, cap)
    assert [t.trial_id for t in view] == scanned(recs, ready, cap)
    assert len(view) == len(scanned(recs, ready, cap)) and bool(view) == bool(len(view))
    assert index.live == sum(r.trial.is_live for r in recs)
    counts = {s: sum(r.trial.status == s for r in recs) for s in TrialStatus}
    assert index.counts() == {s: k for s, k in counts.items() if k}


def test_fifo_picks_the_first_pending_trial_without_walking_the_table():
    recs = records(10_000)
    index = TrialIndex(recs)
    fifo = FIFOScheduler()
    seen: list[str] = []
    for _ in range(3):
        view = index.runnable(lambda _: True, None)
        chosen = fifo.choose_trial_to_run(view)
        seen.append(chosen.trial_id)
        chosen.status = TrialStatus.RUNNING
    assert seen == ["t0", "t1", "t2"]
    recs[1].trial.status = TrialStatus.PENDING  # back in line, in record order
    assert fifo.choose_trial_to_run(index.runnable(lambda _: True, None)).trial_id == "t1"


def test_changed_rows_are_those_whose_status_changed_or_that_were_touched():
    recs = records(5)
    index = TrialIndex(recs)
    assert index.take_changed() is None  # nothing committed yet: every row
    assert index.take_changed() == set()
    recs[3].trial.status = TrialStatus.RUNNING
    recs[3].trial.status = TrialStatus.RUNNING  # no change
    index.touch(recs[1])
    assert index.take_changed() == {1, 3}
    index.touch_all()
    assert index.take_changed() is None
    index.close()
    recs[0].trial.status = TrialStatus.ERROR  # no longer watched
    assert index.take_changed() == set()
