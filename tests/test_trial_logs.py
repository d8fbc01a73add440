"""The derived logs' writer: a round's lines are written after its commit, by a thread of
their own; the next commit records their sizes; a failed write or a lost lease stops
every later write, and the run hears of it before its next commit."""

from __future__ import annotations

import json
import os
import threading

import pytest

from popflow.flows.experiment.trial_logs import TrialLogs
from popflow.flows.experiment.trial_table import TrialRecord
from popflow.infra.storage.folder import Storage
from popflow.infra.store.json_delta import Changed
from popflow.infra.store.layout import PARAMS, RESULTS
from popflow.infra.store.lease import LeaseLost
from popflow.schedulers import Trial


def record(i: int) -> TrialRecord:
    return TrialRecord(trial=Trial(trial_id=f"t{i}", config={"lr": i}), index=i, dirname=f"T_{i}")


@pytest.mark.unit
def test_a_rounds_lines_are_written_after_its_commit_and_the_next_commit_has_their_sizes(
    tmp_path,
):
    storage = Storage(str(tmp_path))
    logs = TrialLogs(storage, flush_interval=30.0)
    rec = record(0)
    gate = threading.Event()
    original = storage.append_text

    def held(text: str, *parts: str) -> int:
        gate.wait(timeout=30)  # the writer waits here until the test lets it go on
        return original(text, *parts)

    storage.append_text = held  # type: ignore[method-assign]
    logs.add_params(rec)
    logs.add_result(rec, {"training_iteration": 1, "score": 0.5})
    results, _ = logs.end_round(seq=1)
    assert results == {"t0": [{"training_iteration": 1, "score": 0.5}]}
    sizes, through = logs.settle(final=False)
    assert sizes == {} and through == 0  # commit 1: its own lines are not written yet
    logs.committed()  # handed to the writer, which waits at the gate
    assert not (tmp_path / "T_0" / RESULTS).exists()
    gate.set()
    logs.add_result(rec, {"training_iteration": 2, "score": 0.7})
    logs.end_round(seq=2)
    sizes, through = logs.settle(final=False)  # waits for commit 1's lines
    assert through == 1 and isinstance(sizes, Changed)
    written = (tmp_path / "T_0" / RESULTS).read_text()
    assert written.count("\n") == 1 and sizes.items == {f"T_0/{RESULTS}": len(written)} | {
        "T_0/progress.csv": (tmp_path / "T_0" / "progress.csv").stat().st_size
    }
    assert (tmp_path / "T_0" / PARAMS).read_text().startswith("{")
    logs.committed()
    sizes, through = logs.settle(final=True)  # the last commit: everything written first
    assert through == 2 and (tmp_path / "T_0" / RESULTS).read_text().count("\n") == 2
    logs.close()


@pytest.mark.unit
def test_a_failed_write_stops_later_writes_and_is_raised_before_the_next_commit(tmp_path):
    storage = Storage(str(tmp_path))
    logs = TrialLogs(storage, flush_interval=30.0)
    a, b = record(0), record(1)
    original = storage.append_text

    def full(text: str, *parts: str) -> int:
        if parts[0] == "T_0":
            raise OSError(28, "No space left on device")
        return original(text, *parts)

    storage.append_text = full  # type: ignore[method-assign]
    logs.add_result(a, {"training_iteration": 1})
    logs.end_round(seq=1)
    logs.settle(final=False)
    logs.committed()
    logs.add_result(b, {"training_iteration": 1})
    logs.end_round(seq=2)
    with pytest.raises(Exception, match="No space left"):
        logs.settle(final=False)
    logs.committed()
    with pytest.raises(Exception, match="No space left"):
        logs.settle(final=True)
    assert not (tmp_path / "T_1").exists()  # nothing after the failure
    logs.close()


@pytest.mark.unit
def test_a_driver_taken_over_writes_no_more_lines(tmp_path):
    storage = Storage(str(tmp_path))
    lost = threading.Event()

    def may_write() -> None:
        if lost.is_set():
            raise LeaseLost("driver epoch 2 took the experiment over")

    logs = TrialLogs(storage, flush_interval=30.0, may_write=may_write)
    recs = [record(i) for i in range(3)]
    for rec in recs:
        logs.add_result(rec, {"training_iteration": 1})
    logs.end_round(seq=1)
    logs.settle(final=False)
    lost.set()  # taken over between the commit and its lines
    logs.committed()
    with pytest.raises(LeaseLost):
        logs.settle(final=False)
    assert not any((tmp_path / r.dirname).exists() for r in recs)
    logs.close()


@pytest.mark.unit
def test_the_writer_checks_before_each_file_and_writes_none_after_a_takeover(tmp_path):
    """A driver that stalled mid-batch (say, SIGSTOPped past its lease) and was taken
    over meanwhile writes no file after its next check (``may_write``: the lease's
    :meth:`~popflow.infra.store.lease.Lease.guard`, which looks in storage every so often)."""
    storage = Storage(str(tmp_path))
    looks: list[int] = []
    lost = threading.Event()

    def may_write() -> None:
        looks.append(1)
        if lost.is_set():
            raise LeaseLost("driver epoch 2 took the experiment over")

    recs = [record(i) for i in range(3)]
    logs = TrialLogs(storage, flush_interval=30.0, may_write=may_write)
    for rec in recs:
        logs.add_result(rec, {"training_iteration": 1})
    logs.end_round(seq=1)
    logs.settle(final=True)
    assert len(looks) == 6  # six files, a check before each
    original = storage.append_text

    def stalls(text: str, *parts: str) -> int:
        size = original(text, *parts)
        lost.set()  # stopped here, and taken over meanwhile
        return size

    storage.append_text = stalls  # type: ignore[method-assign]
    for rec in recs:
        logs.add_result(rec, {"training_iteration": 2})
    logs.end_round(seq=2)
    with pytest.raises(LeaseLost):
        logs.settle(final=True)
    lines = [len((tmp_path / r.dirname / RESULTS).read_text().splitlines()) for r in recs]
    assert lines == [2, 1, 1]  # one file after the takeover's check: none
    logs.close()


@pytest.mark.integration
def test_params_json_is_written_when_a_trial_first_starts_and_again_if_a_crash_lost_it(
    tune_env,
):
    """As Ray, a trial's folder and ``params.json`` appear when it starts (10,000 trials
    no longer wait for 10,000 files); a resume writes the ones a killed driver had not."""
    from trainables import ParityTrainable

    from popflow import run
    from popflow.schedulers import FIFOScheduler, grid_search

    def go(**kwargs):
        return run(
            ParityTrainable,
            {"a": grid_search([1, 2, 3])},
            scheduler=FIFOScheduler(),
            metric="mean_accuracy",
            mode="max",
            stop={"training_iteration": 1},
            name="params",
            seed=0,
            max_concurrent_trials=1,
            commit_interval=1e-6,  # a round per result
            verbose=0,
            **tune_env,
            **kwargs,
        )

    first = go(max_rounds=1)
    folders = [r.path for r in first]
    started = [os.path.exists(os.path.join(f, PARAMS)) for f in folders]
    assert started == [True, False, False]
    assert json.loads(open(os.path.join(folders[0], PARAMS)).read()) == {"a": 1}  # noqa: SIM115
    os.remove(os.path.join(folders[0], PARAMS))  # as if the driver died before writing it
    grid = go(resume=True)
    assert [json.load(open(os.path.join(r.path, PARAMS)))["a"] for r in grid] == [1, 2, 3]  # noqa: SIM115
    assert [len(r.history) for r in grid] == [1, 1, 1]
