"""Checkpoints on local disk publish beside training, within one runner call.

Publishing reads every file a trainable wrote (its SHA-256 for the manifest) and
a restore reads every byte again to check it: at 100 MB that is most of a
second a member on this machine, paid on the round's critical path while it ran
in the segment's thread. A runner call now hands each publish to its transfer
threads and checks a class trainable's checkpoint while its first segments
train; it still returns only when every publish is done, and a failed one ends
its segment in error. A storage whose rename (a local publish's last step) or
manifest read waits for the next segment to train shows the overlap: run in
line, the call would wait for itself.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
from test_segment_local import DirCounter, counting_function
from test_transfers import ok, run_call, trial_spec

from popflow.infra.storage.folder import Storage
from popflow.infra.store.checkpoints import fetch_checkpoint, read_manifest
from popflow.infra.store.layout import MANIFEST
from popflow.infra.store.lease import Lease
from popflow.tasks.specs import SegmentSpec

pytestmark = pytest.mark.unit

GATE = threading.Event()  # set by the segment that trains second
WAIT_S = 30  # a failure guard, never reached when the publish runs beside training


class Gated(Storage):
    """Local disk whose renames (``gate="rename"``) or manifest reads (``"manifest"``)
    wait for :data:`GATE`; a wait that runs out raises."""

    def __init__(self, root: str, gate: str) -> None:
        super().__init__(root)
        self.gate = gate

    def _wait(self) -> None:
        if not GATE.wait(WAIT_S):
            raise AssertionError("waited for a segment that trains after this one")

    def rename(self, src: tuple[str, ...], dst: tuple[str, ...]) -> None:
        if self.gate == "rename":
            self._wait()
        super().rename(src, dst)

    def read_bytes(self, *parts: str) -> bytes:
        if self.gate == "manifest" and parts[-1] == MANIFEST:
            self._wait()
        return super().read_bytes(*parts)


class OpensGate(DirCounter):
    def step(self) -> dict[str, Any]:
        GATE.set()
        return super().step()


@pytest.fixture(autouse=True)
def closed_gate() -> None:
    GATE.clear()
    DirCounter.cleaned.clear()


def trial(storage: Storage, i: int, trainable: Any = DirCounter, **kwargs: Any) -> SegmentSpec:
    """Trial ``i``, one step to its milestone, a checkpoint at each step."""
    return trial_spec(storage, i, trainable, **{"target": 1, **kwargs})


def value_in(storage: Storage, path: str, into: str) -> float:
    fetch_checkpoint(storage, path, into)  # verified: sizes and SHA-256
    with open(os.path.join(into, "sub", "value.txt")) as f:
        return float(f.read())


def test_a_checkpoint_publishes_while_the_next_segment_trains(tmp_path):
    storage = Gated(str(tmp_path / "store"), gate="rename")
    first, second = map(ok, run_call([trial(storage, 0), trial(storage, 1, OpensGate)]))
    # the call returned with both published
    for i, outcome in enumerate([first, second]):
        (ckpt,) = outcome.checkpoints
        path = f"DirCounter_t{i}/{ckpt.name}"
        assert read_manifest(storage, path)["metadata"]["iteration"] == 1
        assert value_in(storage, path, str(tmp_path / f"got{i}")) == i + 1
        assert ckpt.digest is not None  # the manifest's, for the driver to commit


def test_a_restore_is_checked_while_the_first_segments_train(tmp_path):
    plain = Storage(str(tmp_path / "store"))
    (made,) = map(ok, run_call([trial(plain, 0)]))
    restore = f"DirCounter_t0/{made.checkpoints[-1].name}"
    storage = Gated(str(tmp_path / "store"), gate="manifest")
    cold = trial(storage, 0, restore=restore, target=2, taken=frozenset({"checkpoint_000001"}))
    # the cold trial comes first in the call; a trainable continuing live (here a new
    # one, nothing to restore) trains first while the cold one's checkpoint is checked
    restored, _ = map(ok, run_call([cold, trial(storage, 1, OpensGate, checkpoint_frequency=0)]))
    assert [r["value"] for r in restored.results] == [2.0]
    assert restored.restored


def test_a_failed_local_publish_ends_its_segment_in_error_and_frees_its_trainable(tmp_path):
    storage = Storage(str(tmp_path / "store"))
    Lease(storage).take(2, renew=False)  # a newer driver holds the experiment
    outcome, other = run_call([trial(storage, 0, lease_epoch=1), trial(storage, 1)])
    assert outcome.reason == "error"
    assert "publishes nothing more" in (outcome.error or "")
    assert outcome.live_token is None and outcome.worker is None
    assert DirCounter.cleaned.count("t0") == 1  # its parked trainable was discarded
    assert os.listdir(storage.path("DirCounter_t0")) == []  # nothing half-published left
    ok(other)  # the call's other trial, of no epoch, published


def test_a_function_trainables_folder_is_copied_before_report_returns(tmp_path):
    storage = Storage(str(tmp_path / "store"))
    # counting_function removes its folder as soon as report() returns
    (outcome,) = map(
        ok,
        run_call([trial(storage, 0, counting_function, config={"inc": 2.0, "n": 3}, target=3)]),
    )
    assert [c.name for c in outcome.checkpoints] == [
        "checkpoint_000001",
        "checkpoint_000002",
        "checkpoint_000003",
    ]
    into = tmp_path / "got"
    fetch_checkpoint(storage, "DirCounter_t0/checkpoint_000003", str(into))
    assert (into / "state.txt").read_text() == "3 6.0"
