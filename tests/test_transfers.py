"""Checkpoint transfers beside training (tasks.uploads), against moto's S3 server.

A runner call with several segments uploads each checkpoint while the next
segment trains and downloads the checkpoints its cold trials restore from
while the first ones train; the call still returns only with every
checkpoint published, and a failed transfer ends its segment in error.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest
from test_s3 import BrokenFS
from test_segment_local import DirCounter, spec

from popflow.infra.storage.folder import Storage
from popflow.infra.store.checkpoints import fetch_checkpoint, read_manifest
from popflow.tasks.live import discard_parked
from popflow.tasks.segment import run_segments
from popflow.tasks.specs import SegmentOutcome, SegmentSpec

pytestmark = pytest.mark.integration


def trial_spec(storage: Storage, i: int, trainable: Any = DirCounter, **kwargs: Any) -> SegmentSpec:
    args: dict[str, Any] = {
        "trial_id": f"t{i}",
        "trial_dir": f"DirCounter_t{i}",
        "config": {"inc": float(i + 1)},
        "time_attr": "training_iteration",
        "target": 2,
        "checkpoint_frequency": 1,
    }
    args.update(kwargs)
    return spec(storage, trainable, **args)


def run_call(specs: list[SegmentSpec]) -> list[SegmentOutcome]:
    """One runner call's work, in this process; drops what it parked."""
    outcomes = run_segments(specs, "worker-under-test")
    discard_parked([o.live_token for o in outcomes if o.live_token])
    return outcomes


def ok(outcome: SegmentOutcome) -> SegmentOutcome:
    assert outcome.error is None, outcome.error
    return outcome


def test_a_call_returns_with_every_checkpoint_published(s3):
    outcomes = [ok(o) for o in run_call([trial_spec(s3, i) for i in range(3)])]
    for i, outcome in enumerate(outcomes):
        assert [c.name for c in outcome.checkpoints] == ["checkpoint_000001", "checkpoint_000002"]
        for ckpt in outcome.checkpoints:
            path = f"DirCounter_t{i}/{ckpt.name}"
            assert read_manifest(s3, path)["metadata"]["iteration"] == ckpt.iteration
            with tempfile.TemporaryDirectory() as d:
                fetch_checkpoint(s3, path, d)  # verified: sizes and SHA-256
                with open(os.path.join(d, "sub", "value.txt")) as f:
                    assert float(f.read()) == (i + 1) * ckpt.iteration


def test_a_failed_upload_ends_its_segment_in_error_and_frees_its_trainable(s3):
    s3.fs  # noqa: B018  (connect before wrapping)
    s3._fs = BrokenFS(s3._fs, "put_file", PermissionError("access denied"))
    DirCounter.cleaned.clear()
    (outcome,) = run_call([trial_spec(s3, 0)])
    assert outcome.reason == "error"
    assert "access denied" in (outcome.error or "")
    assert outcome.live_token is None and outcome.worker is None
    assert DirCounter.cleaned == [outcome.trial_id]  # the parked trainable was discarded


def test_cold_trials_restore_from_prefetched_checkpoints(s3):
    first = [ok(o) for o in run_call([trial_spec(s3, i) for i in range(3)])]
    restores = [f"DirCounter_t{i}/{o.checkpoints[-1].name}" for i, o in enumerate(first)]
    second = run_call(
        [
            trial_spec(
                s3,
                i,
                restore=restores[i],
                target=4,
                taken=frozenset({"checkpoint_000001", "checkpoint_000002"}),
            )
            for i in range(3)
        ]
    )
    for i, outcome in enumerate(map(ok, second)):
        assert [r["training_iteration"] for r in outcome.results] == [3, 4]
        assert [r["value"] for r in outcome.results] == [(i + 1) * 3, (i + 1) * 4]


def test_a_corrupt_prefetched_checkpoint_is_reported_as_bad(s3):
    (first,) = [ok(o) for o in run_call([trial_spec(s3, 0)])]
    path = f"DirCounter_t0/{first.checkpoints[-1].name}"
    s3.write_bytes(b"not the value", path, "sub", "value.txt")
    (outcome,) = run_call([trial_spec(s3, 0, restore=path, target=3)])
    assert outcome.reason == "error"
    assert outcome.bad_checkpoint == path
