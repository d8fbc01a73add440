"""Incremental commits: a commit costs what its round changed, old commits are pruned, and
a state reads back the same from snapshots and deltas (and over a damaged newest commit)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from popflow.infra import experiment_log
from popflow.infra.experiment_log import (
    DamagedLog,
    ExperimentLog,
    decode_commit,
)
from popflow.infra.json_delta import diff, patch
from popflow.infra.storage import Storage

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(json_values, json_values)
def test_patch_of_diff_gives_the_new_value_and_leaves_the_old_alone(old, new):
    before = json.dumps(old)
    delta = json.loads(json.dumps(diff(old, new)))  # what a commit stores
    assert patch(old, delta) == new
    assert json.dumps(old) == before
    assert diff(new, new) is None


@settings(max_examples=200, deadline=None)
@given(st.lists(json_values, max_size=8), st.lists(json_values, max_size=4))
def test_a_list_that_grew_at_the_end_costs_only_its_new_items(prefix, tail):
    op = diff(prefix, prefix + tail)
    assert op == ({"a": tail} if tail else None)


def trial(i: int, rounds: int) -> dict[str, Any]:
    return {
        "trial_id": f"t{i}",
        "status": "PAUSED" if rounds % 2 else "RUNNING",
        "config": {"lr": 0.1 * i, "depth": i},
        "checkpoints": [
            {
                "name": f"checkpoint_{r:06d}",
                "iteration": r,
                "result": {"score": r * i, "x": "y" * 40},
            }
            for r in range(1, rounds + 1)
        ],
    }


def payload(rounds: int, trials: int = 4) -> dict[str, Any]:
    """A round's commit of a run whose trials keep every checkpoint (the table grows)."""
    return {
        "round": rounds,
        "time": float(rounds),
        "trials": [trial(i, rounds) for i in range(trials)],
        "scheduler": {"rung": list(range(rounds))},
        "decisions": rounds,
        "derived": {f"t{i}/result.json": 100 * rounds for i in range(trials)},
        "policy_total": 0,
        "events": [],
        "deleted": [],
        "results": {f"t{i}": [{"score": rounds}] for i in range(trials)},
        "policy": [],
    }


def write_rounds(storage: Storage, rounds: int) -> tuple[ExperimentLog, list[int]]:
    log = ExperimentLog(storage)
    log.epoch = 1
    sizes = []
    for r in range(1, rounds + 1):
        seq = log.commit(payload(r))
        sizes.append(storage.size(log.commit_path(seq)))
    return log, sizes


def committed(commit: dict[str, Any], rounds: int) -> None:
    expected = json.loads(json.dumps(payload(rounds)))
    assert {k: commit[k] for k in expected} == expected


def test_commit_bytes_grow_linearly_with_the_rounds_and_old_commits_are_pruned(tmp_path):
    _, short_sizes = write_rounds(Storage(str(tmp_path / "short")), 100)
    long, long_sizes = write_rounds(Storage(str(tmp_path / "long")), 400)
    # rewriting the table each commit costs ~16x for 4x the rounds; deltas ~4x
    assert sum(long_sizes) / sum(short_sizes) < 6
    snapshot = len(json.dumps(payload(400)))
    assert sum(long_sizes) < 8 * snapshot  # full rewrites: ~200 snapshots' worth
    deltas = sorted(long_sizes)[: len(long_sizes) // 2]
    assert max(deltas) < 3 * min(deltas)  # a delta's size does not grow with the table
    kept = long.commit_numbers()
    assert kept[-1] == 400 and kept == list(range(kept[0], 401)) and len(kept) < 100
    # kept: the last snapshot and the deltas since (which add up to less than it)
    assert sum(long_sizes[s - 1] for s in kept) < 2 * long_sizes[kept[0] - 1]
    committed(ExperimentLog(Storage(str(tmp_path / "long"))).latest(), 400)
    committed(ExperimentLog(Storage(str(tmp_path / "short"))).latest(), 100)


def test_every_kept_commit_reads_back_its_own_state(tmp_path):
    write_rounds(Storage(str(tmp_path)), 60)
    reader = ExperimentLog(Storage(str(tmp_path)))
    for seq in reader.commit_numbers():
        committed(reader.read(seq), seq)


def test_a_damaged_newest_snapshot_falls_back_to_the_delta_before_it(tmp_path):
    storage = Storage(str(tmp_path))
    log = ExperimentLog(storage)
    log.epoch = 1
    seq = 0
    while seq < 3 or not log.snapshot_due():  # up to the commit before a snapshot
        seq = log.commit(payload(seq + 1))
    snap = log.commit(payload(seq + 1))
    assert "state" in log.read_record(snap) and "delta" in log.read_record(snap - 1)
    (tmp_path / log.commit_path(snap)).write_bytes(b"torn")
    found = ExperimentLog(storage).find_latest()
    assert found.damaged == snap
    committed(found.commit, snap - 1)


def test_a_damaged_commit_right_after_the_pruning_falls_back_to_the_snapshot(tmp_path):
    storage = Storage(str(tmp_path))
    log = ExperimentLog(storage)
    log.epoch = 1
    seq = log.commit(payload(1))
    while not log.snapshot_due():
        seq = log.commit(payload(seq + 1))
    snap = log.commit(payload(seq + 1))
    after = log.commit(payload(snap + 1))
    assert log.commit_numbers() == [snap, after]  # everything before the snapshot went
    (tmp_path / log.commit_path(after)).write_bytes(b"{}")
    found = ExperimentLog(storage).find_latest()
    assert found.damaged == after
    committed(found.commit, snap)


def test_a_damaged_delta_under_the_newest_stops_reading_and_names_it(tmp_path):
    storage = Storage(str(tmp_path))
    log = ExperimentLog(storage)
    log.epoch = 1
    for r in range(40, 45):  # a large table: deltas are small beside its snapshot
        log.commit(payload(r))
    assert log.read_record(5)["base"] == 1
    path = tmp_path / log.commit_path(4)
    path.write_bytes(path.read_bytes()[:-10])
    before = {p.name: p.read_bytes() for p in (tmp_path / ".popflow" / "commits").iterdir()}
    with pytest.raises(DamagedLog, match=r"commit 4 .*which commit 5 builds on"):
        ExperimentLog(storage).latest()
    after = {p.name: p.read_bytes() for p in (tmp_path / ".popflow" / "commits").iterdir()}
    assert after == before


def test_a_snapshot_is_written_at_least_every_max_deltas_commits(tmp_path, monkeypatch):
    monkeypatch.setattr(experiment_log, "MAX_DELTAS", 10)  # 1000 in a real run
    log = ExperimentLog(Storage(str(tmp_path)))
    log.epoch = 1
    same = {**payload(1, trials=200), "results": {}}  # deltas stay far below the snapshot
    kinds = []
    for _ in range(12):
        seq = log.commit(same)
        kinds.append("state" in decode_commit((tmp_path / log.commit_path(seq)).read_bytes()))
    assert kinds == [True] + [False] * 10 + [True]


def test_commits_on_s3_are_incremental_and_pruned(s3_url, s3_server):
    _, options = s3_server
    storage = Storage(s3_url, options)
    _, sizes = write_rounds(storage, 120)
    kept = ExperimentLog(storage).commit_numbers()
    assert kept[-1] == 120 and len(kept) < 40
    assert sum(sizes) < 8 * len(json.dumps(payload(120)))
    committed(ExperimentLog(storage).latest(), 120)


def test_commits_whose_lines_wait_for_a_flush_are_kept_until_the_logs_hold_them(tmp_path):
    """On object stores the derived logs are flushed every so often: until then a resume
    appends their lines from the commits, so those commits stay."""
    storage = Storage(str(tmp_path))
    log = ExperimentLog(storage)
    log.epoch = 1
    snapshots = []
    for r in range(1, 41):
        seq = log.commit(payload(r), logs_written=False)
        if "state" in log.read_record(seq):
            snapshots.append(seq)
    assert len(snapshots) >= 3 and log.commit_numbers() == list(range(1, 41))
    log.commit(payload(41), logs_written=True)
    assert log.commit_numbers() == list(range(1, 42))  # a resume may fall back to 40
    newest_snapshot = max(s for s in [*snapshots, 41] if "state" in log.read_record(s))
    log.commit(payload(42), logs_written=False)
    assert log.commit_numbers() == list(range(newest_snapshot, 43))
    committed(ExperimentLog(storage).latest(), 42)
