"""Checkpoint transfers beside training (tasks.uploads), against moto's S3 server.

A runner call with several segments uploads each checkpoint while the next
segment trains and downloads the checkpoints its cold trials restore from
while the first ones train; the call still returns only with every
checkpoint published, and a failed transfer ends its segment in error.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any

import pytest
from distributed import Event
from support.polling import wait_for
from test_s3 import BrokenFS
from test_segment_local import DirCounter, spec

from popflow.flows.backends.dask_pool import RunnerPool
from popflow.infra.cluster.credentials_plugin import credentials_on_workers
from popflow.infra.storage.folder import Storage
from popflow.infra.store.checkpoints import (
    fetch_checkpoint,
    manifest_digest,
    publish_checkpoint,
    read_manifest,
)
from popflow.tasks.live import discard_parked
from popflow.tasks.restore_fetch import MAX_EARLY, drop_fetched, fetch_early, take_early
from popflow.tasks.segment import run_segments
from popflow.tasks.specs import SegmentOutcome, SegmentSpec

pytestmark = pytest.mark.integration

TAKEN = frozenset({"checkpoint_000001", "checkpoint_000002"})  # t0's, from its first call


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


class Gated(DirCounter):
    """A DirCounter whose steps wait until the Dask event ``config["gate"]`` is set."""

    def step(self) -> dict[str, Any]:
        from distributed import Event

        if not Event(self.config["gate"]).wait(60):
            raise TimeoutError("the gate never opened")
        return super().step()


def test_a_restore_downloaded_early_is_what_its_segment_restores(s3):
    (first,) = [ok(o) for o in run_call([trial_spec(s3, 0)])]
    ckpt = first.checkpoints[-1]
    path = f"DirCounter_t0/{ckpt.name}"
    assert ckpt.digest is not None
    fetch_early(s3, path, ckpt.digest).result()
    s3.remove(path)  # only the early download still has it
    (outcome,) = run_call(
        [trial_spec(s3, 0, restore=path, restore_digest=ckpt.digest, target=3, taken=TAKEN)]
    )
    assert ok(outcome).results[-1]["value"] == 3.0
    assert take_early(s3, path, ckpt.digest) is None  # taken by the segment


def test_early_downloads_nobody_takes_are_bounded_and_removed(s3, tmp_path):
    # one version each of MAX_EARLY + 1 checkpoints (a download is checked against the
    # version it names: its committed digest)
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(b"w")
    versions = []
    for i in range(MAX_EARLY + 1):
        path = f"DirCounter_t0/checkpoint_{i + 1:06d}"
        versions.append((path, manifest_digest(publish_checkpoint(s3, str(src), path, {}))))
    downloads = [fetch_early(s3, path, digest) for path, digest in versions]
    assert take_early(s3, *versions[0]) is None  # the oldest went first
    taken = [take_early(s3, path, digest) for path, digest in versions[1:]]
    assert taken == downloads[1:]
    dropped, _ = downloads[0].result()
    assert dropped is not None
    for future in taken:
        drop_fetched(future)
        tmp, _ = future.result()
        assert tmp is not None
    gone = lambda: not any(os.path.exists(f.result()[0]) for f in downloads)  # noqa: E731
    wait_for(gone, 30, "the unused downloads removed")


def early_downloads_done() -> int:
    """On a worker: how many downloads queued calls started, once they end."""
    from popflow.tasks import restore_fetch

    with restore_fetch._lock:
        futures = list(restore_fetch._early.values())
    for future in futures:
        future.result(timeout=60)
    return len(futures)


def test_a_call_queued_behind_another_downloads_its_restore_when_it_reaches_the_worker(
    s3, dask_cluster
):
    """A PBT clone's call waits on its runner behind the round's other segments: the
    checkpoint it restores is downloaded while they train, not after."""
    (first,) = [ok(o) for o in run_call([trial_spec(s3, 0)])]
    ckpt = first.checkpoints[-1]
    path = f"DirCounter_t0/{ckpt.name}"
    # the workers get the storage's credentials as a run gives them (never in a pickle)
    with credentials_on_workers(dask_cluster, s3.storage_options):
        pool = RunnerPool(dask_cluster, label="early-restore")
        try:
            runner = pool.runners[0]
            gate = Event(f"gate-{uuid.uuid4().hex}", client=dask_cluster)
            ahead = trial_spec(s3, 1, trainable=Gated, config={"inc": 1.0, "gate": gate.name})
            pool.submit([ahead], runner)
            clone = trial_spec(
                s3, 0, restore=path, restore_digest=ckpt.digest, target=3, taken=TAKEN
            )
            pool.submit([clone], runner)
            # the actor call and this look at the worker travel apart: look until it arrived
            w = runner.worker
            done = lambda: dask_cluster.run(early_downloads_done, workers=[w])[w]  # noqa: E731
            assert wait_for(done, 60, "the queued call's download") == 1
            s3.remove(path)  # only the early download still has it
            gate.set()
            outcomes = []
            while len(outcomes) < 2:
                outcomes += [value for _, value in pool.finished()]
            by_trial = {o.trial_id: ok(o) for call in outcomes for o in call}
            assert by_trial["t0"].restored and by_trial["t0"].results[-1]["value"] == 3.0
            assert by_trial["t1"].results[-1]["value"] == 2.0
            pool.discard_parked(
                runner.worker, [o.live_token for o in by_trial.values() if o.live_token]
            )
        finally:
            pool.close()
