"""Sequences of faults that ``benchmarks/chaos.py`` found breaking a promise, each as a
deterministic whole-run test (the crash driver, local disk): a damaged checkpoint that
a clone restores from, a driver killed between a rewind and its commit, a damaged
commit after which logs were written, a driver stalled right after its takeover, and
synchronous PB2 after a checkpoint's fallback."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.driving import DRIVER, drive, read_experiment
from support.polling import wait_for
from test_nothing_lost import damage

from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import ExperimentLog
from popflow.infra.store.layout import commit_path
from popflow.infra.store.lease import lease_holder

pytestmark = pytest.mark.system

KEEP_2 = ["--num-to-keep", "2"]  # a damaged checkpoint has an earlier one to fall back to


def iterations(experiment: str) -> dict[str, list[int]]:
    out = {}
    for entry in sorted(os.listdir(experiment)):
        path = Path(experiment, entry, "result.json")
        if path.exists():
            out[entry] = [json.loads(line)["training_iteration"] for line in path.open()]
    return out


def contiguous(experiment: str, total: int) -> bool:
    return all(its == list(range(1, total + 1)) for its in iterations(experiment).values())


def restores(experiment: str) -> list[tuple[str, str | None]]:
    trials = ExperimentLog(Storage(experiment)).latest()["trials"]
    return [(t["dirname"], t["restore"]) for t in trials]


def flip(experiment: str, checkpoint: str) -> None:
    path = Path(experiment, checkpoint, "_dict_checkpoint.pkl")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_clone_whose_source_checkpoint_is_damaged_logs_each_iteration_once(
    prefect_server, tmp_path
):
    """Synchronous PBT: trial 0 was cloned from trial 3's checkpoint 7, which is damaged
    before the resume; both go on from trial 3's checkpoint 6, and neither logs
    iteration 7 twice (the clone did)."""
    storage, experiment = str(tmp_path), str(tmp_path / "exp")
    assert drive(storage, "exp", "pbt_synch", "commit-after:8", extra=KEEP_2) != 0
    shared = [r for d, r in restores(experiment) if r and not r.startswith(d + "/")]
    assert shared, restores(experiment)  # a checkpoint a clone restores from
    flip(experiment, shared[0])
    drive(storage, "exp", "pbt_synch", extra=KEEP_2)
    assert contiguous(experiment, 24), iterations(experiment)


def test_a_driver_killed_between_a_rewind_and_its_commit_leaves_a_resumable_experiment(
    prefect_server, tmp_path
):
    """Asynchronous PBT: a waiting trial's newest checkpoint is damaged; the resume falls
    back and supersedes the results after the earlier one, and is killed right after
    (``cut-back``), then again right after its logs were cut (``cut-made``). Resumes
    went on failing with 'the experiment folder was changed by hand' when the cut was
    made before the commit that records it."""
    storage, experiment = str(tmp_path), str(tmp_path / "exp")
    assert drive(storage, "exp", "pbt_async", "commit-after:15", extra=KEEP_2) != 0
    trials = ExperimentLog(Storage(experiment)).latest()["trials"]
    own = [
        t["restore"]
        for t in trials
        if t["status"] == "PENDING"
        and t["restore"]
        and t["restore"].startswith(t["dirname"] + "/")
        and len(t["checkpoints"]) > 1
    ]
    assert own, trials
    flip(experiment, own[0])
    assert drive(storage, "exp", "pbt_async", "cut-back:0", extra=KEEP_2) == -signal.SIGKILL
    drive(storage, "exp", "pbt_async", "cut-made:0", extra=KEEP_2)  # may finish first
    drive(storage, "exp", "pbt_async", extra=KEEP_2)
    assert set(read_experiment(experiment)["status"]) == {"TERMINATED"}
    for its in iterations(experiment).values():  # asynchronous PBT clones go back in time
        assert len(its) >= 24 and its[0] == 1
        assert all(b == a + 1 for a, b in itertools.pairwise(its) if b > a), its


def test_falling_back_over_a_damaged_commit_cuts_the_logs_written_after_it(
    prefect_server, tmp_path
):
    """ASHA, killed just before commit 4, its commit 3 damaged: the resume goes on from
    commit 2, and cuts the result.json files created after it (they were left as they
    were, and their trials logged [1, 1, 2, ...])."""
    storage, experiment = str(tmp_path), str(tmp_path / "exp")
    assert drive(storage, "exp", "asha", "commit-before:4", extra=KEEP_2) != 0
    log = ExperimentLog(Storage(experiment))
    damage(Path(experiment, commit_path(log.commit_numbers()[-1])), "truncated")
    drive(storage, "exp", "asha", extra=KEEP_2)
    for its in iterations(experiment).values():
        assert its == list(range(1, len(its) + 1)), its


def test_a_driver_stalled_right_after_its_takeover_changes_nothing_when_it_wakes(
    prefect_server, tmp_path
):
    """Driver A stops (SIGSTOP) right after its takeover commit, before it cleans up the
    experiment; B takes over and trains on; A wakes. A must stop with LeaseLost before
    its clean-up cuts B's logs or deletes B's checkpoints (it cut every result.json
    back, and B's experiment lost iterations)."""
    storage, experiment = str(tmp_path), str(tmp_path / "exp")
    assert drive(storage, "exp", "pbt_synch", "commit-after:8", extra=KEEP_2) != 0
    cmd = [sys.executable, DRIVER, storage, "exp", "pbt_synch", *KEEP_2, "--lease-ttl", "3"]
    a = subprocess.Popen(
        [*cmd, "--kill-at", "stop-after:9"],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    b = None
    try:
        wait_for(lambda: _state(a.pid) == "T", 120, "A did not stop after its takeover commit")
        wait_for(lambda: lease_holder(Storage(experiment)) is None, 120, "A's lease did not lapse")
        b = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, start_new_session=True)
        log = ExperimentLog(Storage(experiment))
        try:
            wait_for(lambda: max(log.commit_numbers()) >= 14 or b.poll() is not None, 120, "B")
        except AssertionError:  # say where B was (a CI run once saw it not get there)
            os.killpg(b.pid, signal.SIGKILL)
            _, b_err = b.communicate(timeout=60)
            raise AssertionError(
                f"B stalled at commit {max(log.commit_numbers())}:\n{b_err[-3000:]}"
            ) from None
        os.kill(a.pid, signal.SIGCONT)
        _, a_err = a.communicate(timeout=300)
        _, b_err = b.communicate(timeout=300)
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert a.returncode != 0 and "LeaseLost" in a_err, a_err[-3000:]
    assert b.returncode == 0, b_err[-3000:]
    assert contiguous(experiment, 24), iterations(experiment)
    drive(f"{storage}-ref", "exp", "pbt_synch", extra=KEEP_2)
    assert read_experiment(experiment) == read_experiment(f"{storage}-ref/exp")


def test_synch_pb2_falling_back_from_a_damaged_checkpoint_ends_identical(prefect_server, tmp_path):
    """A trial's own newest checkpoint is damaged: it runs again from the one before,
    within the round, and the iterations it runs again are not reported to PB2 a second
    time, so PB2's data and decisions are an uninterrupted run's (its GP saw the rows in
    another order, and explored differently at iteration 58)."""
    storage, experiment = str(tmp_path), str(tmp_path / "exp")
    extra = [*KEEP_2, "--iterations", "60"]
    assert drive(storage, "exp", "pb2_synch", "commit-after:12", extra=extra) != 0
    pairs = restores(experiment)
    own = [
        r for d, r in pairs if r and r.startswith(d + "/") and sum(r == q for _, q in pairs) == 1
    ]
    assert own, pairs
    flip(experiment, own[0])
    drive(storage, "exp", "pb2_synch", extra=extra)
    drive(f"{storage}-ref", "exp", "pb2_synch", extra=extra)
    assert read_experiment(experiment) == read_experiment(f"{storage}-ref/exp")


def test_a_damaged_first_checkpoint_after_an_exploit_falls_back_to_the_cloned_state(
    prefect_server, tmp_path
):
    """Synchronous PBT: a trial cloned another's checkpoint (its config too) and wrote one
    checkpoint since; that one is damaged before the resume. The trial must go on from
    the state the exploit cloned, as an uninterrupted run did; it went on from its own
    older checkpoint, from before the exploit, and trained iterations 3 and 4 with its
    old state (a=20) under the cloned config (a=40)."""
    storage, experiment = str(tmp_path), str(tmp_path / "exp")
    assert drive(storage, "exp", "pbt_synch", "commit-after:4", extra=KEEP_2) != 0
    trials = ExperimentLog(Storage(experiment)).latest()["trials"]
    first_after = [
        t["restore"]
        for t in trials
        if t["lineage"]
        and t["restore"].startswith(t["dirname"] + "/")
        and t["restore_iteration"] == t["lineage"][-1][3] + 1  # its first since the exploit
        and any(c["iteration"] < t["restore_iteration"] for c in t["checkpoints"])
    ]
    assert first_after, trials
    flip(experiment, first_after[0])
    logs: list[str] = []
    drive(storage, "exp", "pbt_synch", extra=KEEP_2, logs=logs)
    assert f"checkpoint {first_after[0]} failed its check" in logs[0]
    drive(f"{storage}-ref", "exp", "pbt_synch", extra=KEEP_2)
    assert read_experiment(experiment) == read_experiment(f"{storage}-ref/exp")


def test_a_clone_whose_cloned_checkpoint_is_damaged_ends_as_an_undisturbed_run(
    prefect_server, tmp_path
):
    """Synchronous PBT: the driver dies right after a round that exploited; the checkpoint
    the clone restores from (its source's, which its exploit cloned) is damaged before the
    resume. The source falls back and trains again; the clone gets the state it cloned
    made again (the source's training from its checkpoint before, with the source's
    config and seeds, not logged) and goes on from it with its new config: the run ends
    as an undisturbed one. It went on from the source's older state under its new config
    and logged that over its own result at the exploit's iteration."""
    storage, experiment = str(tmp_path), str(tmp_path / "exp")
    assert drive(storage, "exp", "pbt_synch", "commit-after:8", extra=KEEP_2) != 0
    trials = ExperimentLog(Storage(experiment)).latest()["trials"]
    cloned = [
        t["restore"]
        for t in trials
        if t["restore"]
        and not t["restore"].startswith(t["dirname"] + "/")
        and (t.get("start") or {}).get("restore") == t["restore"]
    ]
    assert cloned, trials
    flip(experiment, cloned[0])
    drive(storage, "exp", "pbt_synch", extra=KEEP_2)
    drive(f"{storage}-ref", "exp", "pbt_synch", extra=KEEP_2)
    assert read_experiment(experiment) == read_experiment(f"{storage}-ref/exp")


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
