"""Incremental commits: a commit costs what its round changed, old commits are pruned, and
a state reads back the same from snapshots and deltas (and over a damaged newest commit)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.examples import examples

from popflow.infra.storage.folder import Storage
from popflow.infra.store import commit_log as experiment_log
from popflow.infra.store.commit_log import (
    DamagedLog,
    ExperimentLog,
    decode_commit,
    encode_commit,
)
from popflow.infra.store.json_delta import Changed, diff, patch
from popflow.infra.store.layout import commit_path
from popflow.infra.store.state_text import StateText

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4)
    ),
    max_leaves=20,
)


@pytest.mark.unit
@settings(max_examples=examples(400), deadline=None)
@given(json_values, json_values)
def test_patch_of_diff_gives_the_new_value_and_leaves_the_old_alone(old, new):
    before = json.dumps(old)
    delta = json.loads(json.dumps(diff(old, new)))  # what a commit stores
    assert patch(old, delta) == new
    assert json.dumps(old) == before
    assert diff(new, new) is None


@pytest.mark.unit
@settings(max_examples=examples(200), deadline=None)
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
        sizes.append(storage.size(commit_path(seq)))
    return log, sizes


def committed(commit: dict[str, Any], rounds: int) -> None:
    expected = json.loads(json.dumps(payload(rounds)))
    assert {k: commit[k] for k in expected} == expected


@pytest.mark.unit
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


@pytest.mark.unit
def test_every_kept_commit_reads_back_its_own_state(tmp_path):
    write_rounds(Storage(str(tmp_path)), 60)
    reader = ExperimentLog(Storage(str(tmp_path)))
    for seq in reader.commit_numbers():
        committed(reader.read(seq), seq)


@pytest.mark.unit
def test_a_damaged_newest_snapshot_falls_back_to_the_delta_before_it(tmp_path):
    storage = Storage(str(tmp_path))
    log = ExperimentLog(storage)
    log.epoch = 1
    seq = 0
    while seq < 3 or not log.snapshot_due():  # up to the commit before a snapshot
        seq = log.commit(payload(seq + 1))
    snap = log.commit(payload(seq + 1))
    assert "state" in log.read_record(snap) and "delta" in log.read_record(snap - 1)
    (tmp_path / commit_path(snap)).write_bytes(b"torn")
    found = ExperimentLog(storage).find_latest()
    assert found.damaged == snap
    committed(found.commit, snap - 1)


@pytest.mark.unit
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
    (tmp_path / commit_path(after)).write_bytes(b"{}")
    found = ExperimentLog(storage).find_latest()
    assert found.damaged == after
    committed(found.commit, snap)


@pytest.mark.unit
def test_a_damaged_delta_under_the_newest_stops_reading_and_names_it(tmp_path):
    storage = Storage(str(tmp_path))
    log = ExperimentLog(storage)
    log.epoch = 1
    for r in range(40, 45):  # a large table: deltas are small beside its snapshot
        log.commit(payload(r))
    assert log.read_record(5)["base"] == 1
    path = tmp_path / commit_path(4)
    path.write_bytes(path.read_bytes()[:-10])
    before = {p.name: p.read_bytes() for p in (tmp_path / ".popflow" / "commits").iterdir()}
    with pytest.raises(DamagedLog, match=r"commit 4 .*which commit 5 builds on"):
        ExperimentLog(storage).latest()
    after = {p.name: p.read_bytes() for p in (tmp_path / ".popflow" / "commits").iterdir()}
    assert after == before


@pytest.mark.unit
def test_a_snapshot_is_written_at_least_every_max_deltas_commits(tmp_path, monkeypatch):
    monkeypatch.setattr(experiment_log, "MAX_DELTAS", 10)  # 1000 in a real run
    log = ExperimentLog(Storage(str(tmp_path)))
    log.epoch = 1
    same = {**payload(1, trials=200), "results": {}}  # deltas stay far below the snapshot
    kinds = []
    for _ in range(12):
        seq = log.commit(same)
        kinds.append("state" in decode_commit((tmp_path / commit_path(seq)).read_bytes()))
    assert kinds == [True] + [False] * 10 + [True]


@pytest.mark.integration
def test_commits_on_s3_are_incremental_and_pruned(s3_url, s3_server):
    _, options = s3_server
    storage = Storage(s3_url, options)
    _, sizes = write_rounds(storage, 120)
    kept = ExperimentLog(storage).commit_numbers()
    assert kept[-1] == 120 and len(kept) < 40
    assert sum(sizes) < 8 * len(json.dumps(payload(120)))
    committed(ExperimentLog(storage).latest(), 120)


@pytest.mark.unit
def test_commits_whose_lines_wait_for_a_flush_are_kept_until_the_logs_hold_them(tmp_path):
    """On object stores the derived logs are flushed every so often: until then a resume
    appends their lines from the commits, so those commits stay."""
    storage = Storage(str(tmp_path))
    log = ExperimentLog(storage)
    log.epoch = 1
    snapshots = []
    for r in range(1, 41):
        seq = log.commit(payload(r), logs_through=0)
        if "state" in log.read_record(seq):
            snapshots.append(seq)
    assert len(snapshots) >= 3 and log.commit_numbers() == list(range(1, 41))
    log.commit(payload(41))
    assert log.commit_numbers() == list(range(1, 42))  # a resume may fall back to 40
    newest_snapshot = max(s for s in [*snapshots, 41] if "state" in log.read_record(s))
    log.commit(payload(42), logs_through=0)
    assert log.commit_numbers() == list(range(newest_snapshot, 43))
    committed(ExperimentLog(storage).latest(), 42)


# -- commits of what changed (StateText, Changed) ------------------------------------------


@pytest.mark.unit
@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(json_values, min_size=1, max_size=6),
    st.dictionaries(st.text(max_size=3), json_values, max_size=5),
    st.data(),
)
def test_a_state_given_by_its_changed_items_is_the_state_given_whole(rows, sizes, data):
    """StateText's delta from Changed items patches the old state into the new one, and
    its snapshot text reads back as the whole new state."""
    keys = ("trials", "derived", "round")
    old = {"trials": rows, "derived": sizes, "round": 1}
    changed_rows = data.draw(
        st.dictionaries(st.integers(0, len(rows) - 1), json_values, max_size=len(rows))
    )
    changed_sizes = data.draw(st.dictionaries(st.text(max_size=3), json_values, max_size=4))
    new_rows = [changed_rows.get(i, row) for i, row in enumerate(rows)]
    new = {"trials": new_rows, "derived": {**sizes, **changed_sizes}, "round": 2}
    state, delta = StateText(keys, old).update(
        {"trials": Changed(changed_rows), "derived": Changed(changed_sizes), "round": 2}
    )
    expected = json.loads(json.dumps(new))
    assert patch(json.loads(json.dumps(old)), json.loads(json.dumps(delta))) == expected
    assert json.loads(state.json()) == expected == state.value()
    whole, whole_delta = StateText(keys, old).update(new)  # given whole: the same state
    assert whole.value() == expected
    assert patch(json.loads(json.dumps(old)), whole_delta) == expected


@pytest.mark.unit
def test_a_commit_of_changed_rows_costs_those_rows_and_reads_back_whole(tmp_path):
    storage = Storage(str(tmp_path))
    log = ExperimentLog(storage)
    log.epoch = 1
    first = payload(1, trials=200)
    log.commit(first)
    first["results"] = {}  # the later rounds' own fields: none
    row = trial(7, 2)
    seq = log.commit(
        {
            **first,
            "round": 2,
            "trials": Changed({7: row}),
            "derived": Changed({"t7/result.json": 5}),
        },
        snapshot=False,
    )
    record = log.read_record(seq)
    assert record["delta"]["d"]["trials"] == {"i": {"7": diff(trial(7, 1), row)}}
    assert len(encode_commit(record)) < 2000  # one row's change, not 200 rows
    state = ExperimentLog(storage).latest()
    assert state["trials"][7] == row and state["trials"][8] == first["trials"][8]
    assert state["derived"]["t7/result.json"] == 5 and state["round"] == 2
    snap = log.commit({**first, "round": 3, "trials": Changed({})}, snapshot=True)
    assert log.read(snap)["trials"][7] == row  # a snapshot joins the rows' texts
    assert log.state["trials"][7] == row


@pytest.mark.unit
def test_changed_rows_need_a_whole_state_first_and_keep_the_length(tmp_path):
    log = ExperimentLog(Storage(str(tmp_path)))
    log.epoch = 1
    with pytest.raises(ValueError, match="needs its whole value"):
        log.commit({"trials": Changed({0: {}}), "round": 0})
    log.commit({"trials": [{"a": 1}], "round": 0})
    with pytest.raises(IndexError, match="keeps its length"):
        log.commit({"trials": Changed({3: {}}), "round": 1})


@pytest.mark.unit
@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(json_values, max_size=6),
    st.lists(json_values, max_size=3),
    st.one_of(st.none(), st.integers(0, 5)),
    json_values,
)
def test_a_rows_list_field_that_grew_costs_its_new_items(items, tail, dropped, status):
    """A trial's checkpoints grow each round: only the new ones are parsed and committed;
    any other change to the list is diffed whole, and always patches back exactly."""
    keys = ("trials",)
    old_row = {"checkpoints": items, "status": "RUNNING"}
    new_items = [*items, *tail]
    if dropped is not None and dropped < len(new_items):  # retention took one out
        del new_items[dropped]
    new_row = {"checkpoints": new_items, "status": status}
    _, delta = StateText(keys, {"trials": [old_row]}).update({"trials": Changed({0: new_row})})
    stored = json.loads(json.dumps(delta))
    assert patch({"trials": json.loads(json.dumps([old_row]))}, stored) == json.loads(
        json.dumps({"trials": [new_row]})
    )
    if dropped is None and tail:
        field = stored["d"]["trials"]["i"]["0"]["d"]["checkpoints"]
        assert field == {"a": json.loads(json.dumps(tail))}
