"""Synchronous PBT on moto's S3 server, on real Dask workers: a round's commit is written
while the next round trains, never before the checkpoints it names are stored; a worker
lost while its checkpoints upload costs the round again, not the run, and the results
are those of a run where nothing happened."""

from __future__ import annotations

import json
import uuid

import pytest
from test_s3_tune import parity_kwargs
from trainables import HeldUpload

from popflow import run
from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import ExperimentLog
from popflow.infra.store.layout import MANIFEST
from popflow.tasks.progress import comparable

pytestmark = pytest.mark.integration

HOLD_AT = 2  # the iteration (and round) whose first checkpoint is held back


def held_run(s3_server, s3_bucket, tmp_path, then: str, hold_at: int = HOLD_AT):
    """Three trials of synchronous PBT for 4 rounds on one worker; the first checkpoint of
    round ``hold_at`` is uploaded only once the next round has trained in its process."""
    _, options = s3_server
    marks = tmp_path / f"marks-{then}"
    marks.mkdir()
    storage = f"s3://{s3_bucket}/pipelined"
    name = f"{then}-{uuid.uuid4().hex[:8]}"
    kwargs = parity_kwargs()  # a = 10/20/40, synchronous PBT every iteration, seed 0
    kwargs["param_space"].update(
        hold_at=hold_at,
        then=then,
        marks=str(marks),
        experiment=f"{storage}/{name}",
        options=options,
    )
    kwargs["stop"] = {"training_iteration": 4}
    grid = run(
        HeldUpload,
        **kwargs,
        storage=storage,
        storage_options=options,
        name=name,
        n_workers=1,
    )
    seen = marks / "seen.json"
    log = ExperimentLog(Storage(f"{storage}/{name}", options))
    return grid, json.loads(seen.read_text()) if seen.exists() else None, log


def outcome(grid) -> list:
    """What the trials did: their configs (less this test's plumbing) and histories."""
    plumbing = {"hold_at", "then", "marks", "experiment", "options"}
    return [
        (
            {k: v for k, v in r.config.items() if k not in plumbing},
            [
                {k: v for k, v in comparable(h).items() if k not in ("config", "trial_id")}
                for h in r.history
            ],
        )
        for r in grid
    ]


@pytest.fixture(scope="module")
def reference(prefect_server, s3_server, s3_bucket, tmp_path_factory) -> list:
    """The same run with nothing held back."""
    grid, seen, _ = held_run(
        s3_server, s3_bucket, tmp_path_factory.mktemp("reference"), "release", hold_at=-1
    )
    assert seen is None
    return outcome(grid)


def test_the_next_round_trains_while_a_checkpoint_uploads_and_commits_wait(
    prefect_server, s3_server, s3_bucket, tmp_path, reference
):
    grid, seen, log = held_run(s3_server, s3_bucket, tmp_path, "release")
    # a segment of round 3 trained while round 2's checkpoint was still publishing ...
    assert seen is not None, "no segment of the next round ran while the upload was held"
    assert any(f"checkpoint_{HOLD_AT:06d}" in path for path in seen["publishing"])
    # ... and round 2 was not committed then: its commit waits for its checkpoints
    assert seen["committed_round"] == HOLD_AT - 1
    assert outcome(grid) == reference
    assert all(len(history) == 4 for _, history in outcome(grid))
    # every checkpoint the last commit names is in storage, as committed
    final = log.latest()
    for trial in final["trials"]:
        for ckpt in trial["checkpoints"]:
            assert ckpt["digest"] is not None
            assert log.storage.exists(trial["dirname"], ckpt["name"], MANIFEST)


def test_a_worker_lost_while_its_checkpoints_upload_costs_a_rerun_not_the_run(
    prefect_server, s3_server, s3_bucket, tmp_path, reference
):
    grid, seen, log = held_run(s3_server, s3_bucket, tmp_path, "kill")
    assert seen is not None and seen["committed_round"] == HOLD_AT - 1  # it died then
    events = [e for seq in log.commit_numbers() for e in log.read_record(seq)["events"]]
    reruns = [e for e in events if e.startswith("[rerun]")]
    assert len(reruns) == 1, events
    assert f"round {HOLD_AT}'s checkpoints were not all stored" in reruns[0]
    assert outcome(grid) == reference
    assert not grid.errors
