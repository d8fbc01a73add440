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
    CommitConflict,
    DamagedLog,
    ExperimentLog,
    PrunedCommit,
    decode_commit,
    encode_commit,
)
from popflow.infra.store.json_delta import Changed, diff, patch
from popflow.infra.store.layout import COMMITS, commit_path
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


# -- a pruned number stays taken: a stale driver's commit cannot land there ---------------


def take_over_and_prune(
    storage: Storage, epoch: int, first_round: int, number: int
) -> ExperimentLog:
    """A newer driver (``epoch``) resumes the log and commits until commit ``number`` is
    pruned (its commits start at round ``first_round``)."""
    new = ExperimentLog(storage)
    new.find_latest()
    new.epoch = epoch
    for r in range(first_round, first_round + 200):
        new.commit(payload(r))
        if number not in new.commit_numbers():
            return new
    raise AssertionError(f"commit {number} was never pruned")


def stale_commit_refused(storage: Storage, stale: ExperimentLog, by: int) -> None:
    """``stale`` (woken after a takeover) cannot commit; what a reader sees is unchanged."""
    numbers = ExperimentLog(storage).commit_numbers()
    latest = ExperimentLog(storage).latest()
    with pytest.raises(CommitConflict) as refused:
        stale.commit(payload(stale.seq + 1))
    assert refused.value.epoch == by
    reader = ExperimentLog(storage)
    assert reader.commit_numbers() == numbers and reader.latest() == latest
    epochs = [reader.read_record(n)["epoch"] for n in numbers]
    assert set(epochs) == {by}  # every commit a reader lists is the new driver's


@pytest.mark.unit
def test_a_stale_driver_cannot_commit_under_a_number_the_new_driver_pruned(tmp_path):
    """Driver A (epoch 1) committed 1..3 and stopped before 4; B (epoch 2) took over, wrote
    4 (its first) and more, and pruned 4. A wakes: its commit 4 is refused (before, it was
    created: create-only is no fence for a deleted number)."""
    storage = Storage(str(tmp_path))
    stale = ExperimentLog(storage)
    stale.epoch = 1
    for r in range(1, 4):
        stale.commit(payload(r))
    take_over_and_prune(storage, epoch=2, first_round=4, number=4)
    stale_commit_refused(storage, stale, by=2)
    with pytest.raises(PrunedCommit):  # its file is a tombstone, never listed
        ExperimentLog(storage).read_record(4)
    assert "00000004.pruned" in storage.listdir(COMMITS)


@pytest.mark.unit
def test_a_stale_driver_that_never_committed_cannot_write_commit_one_after_it_was_pruned(
    tmp_path,
):
    """A (epoch 1) took the lease of a new experiment and stopped before its first commit;
    B (epoch 2) started it afresh and pruned commit 1; A wakes."""
    storage = Storage(str(tmp_path))
    stale = ExperimentLog(storage)
    stale.epoch = 1
    take_over_and_prune(storage, epoch=2, first_round=1, number=1)
    stale_commit_refused(storage, stale, by=2)


@pytest.mark.unit
def test_each_takeover_keeps_its_first_number_and_only_that(tmp_path):
    """Three drivers in a row: each one's first commit is kept as a tombstone when pruned,
    every other pruned commit is deleted; a stale driver of each earlier epoch is refused."""
    storage = Storage(str(tmp_path))
    a = ExperimentLog(storage)
    a.epoch = 1
    for r in range(1, 4):
        a.commit(payload(r))
    b = ExperimentLog(storage)
    b.find_latest()
    b.epoch = 2
    for r in range(4, 7):
        b.commit(payload(r))
    c = take_over_and_prune(storage, epoch=3, first_round=7, number=7)
    pruned = sorted(n for n in storage.listdir(COMMITS) if n.endswith(".pruned"))
    assert pruned == ["00000001.pruned", "00000004.pruned", "00000007.pruned"]
    stale_commit_refused(storage, a, by=3)  # A's 4 is a tombstone B's first left
    stale_commit_refused(storage, b, by=3)
    c.commit(payload(c.seq + 1))
    assert c.state["fences"] == []  # all three pruned: a state names the kept ones only


@pytest.mark.unit
def test_a_log_written_before_fences_keeps_every_commit_it_had_when_pruned(tmp_path):
    """Commits of an older version carry no ``fences``: the driver that resumes them takes
    every kept commit as one, so a stale driver of that version is refused at any of them."""
    storage = Storage(str(tmp_path))
    for seq in range(1, 4):
        state = {k: v for k, v in payload(seq).items() if k in experiment_log.STATE_KEYS}
        record = {k: v for k, v in payload(seq).items() if k not in state}
        data = encode_commit({**record, "seq": seq, "epoch": 1}, json.dumps(state))
        assert storage.create_bytes(data, commit_path(seq))
    assert ExperimentLog(storage).latest()["round"] == 3  # readable as it is
    stale = ExperimentLog(storage)
    stale.epoch, stale.seq = 1, 1  # stopped before its commit 2
    take_over_and_prune(storage, epoch=2, first_round=4, number=4)
    stale_commit_refused(storage, stale, by=2)


@pytest.mark.integration
def test_a_stale_driver_cannot_commit_under_a_pruned_number_on_s3(s3_url, s3_server):
    """The same on S3: the tombstone's name is taken, so the conditional PUT
    (``If-None-Match: *``) of A's commit is refused by the store."""
    _, options = s3_server
    storage = Storage(f"{s3_url}/stale-prune", options)
    stale = ExperimentLog(storage)
    stale.epoch = 1
    for r in range(1, 4):
        stale.commit(payload(r))
    take_over_and_prune(storage, epoch=2, first_round=4, number=4)
    stale_commit_refused(storage, stale, by=2)


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
