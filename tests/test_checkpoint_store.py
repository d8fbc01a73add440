"""infra.checkpoint_store: checkpoints published atomically with a manifest and verified on load."""

from __future__ import annotations

import json
import re
import uuid

import pytest
from support.trees import read_tree, write_tree

from popflow.infra.storage.folder import Storage
from popflow.infra.store.checkpoints import (
    CheckpointError,
    fetch_checkpoint,
    publish_checkpoint,
    read_manifest,
)
from popflow.infra.store.layout import MANIFEST

pytestmark = pytest.mark.unit

FILES = {
    "model.bin": bytes(range(256)) * 40,
    "optim/state.json": b'{"lr": 0.1}',
    "optim/deep/empty": b"",
}
CKPT = "Trainable_t0/checkpoint_000003"


@pytest.fixture(params=["local", "memory"])
def storage(request, tmp_path):
    """A local folder, and fsspec's in-memory store standing in for an object store."""
    if request.param == "local":
        yield Storage(str(tmp_path / "store"))
        return
    s = Storage(f"memory://ckpt-test-{uuid.uuid4().hex}")
    yield s
    s.remove()


@pytest.fixture
def published(storage, tmp_path):
    src = write_tree(tmp_path / "src", FILES)
    metadata = {"iteration": 3, "time_total_s": 1.5, "result": {"loss": 0.25, "nested": [1, 2]}}
    publish_checkpoint(storage, src, CKPT, metadata)
    return storage, metadata


def test_round_trip_of_nested_files_and_metadata(published, tmp_path):
    storage, metadata = published
    dst = tmp_path / "dst"
    assert fetch_checkpoint(storage, CKPT, str(dst)) == metadata
    assert read_tree(dst) == FILES  # the manifest itself is not copied out


def test_manifest_lists_every_file_with_size_and_sha256(published):
    storage, metadata = published
    manifest = read_manifest(storage, CKPT)
    assert manifest["metadata"] == metadata
    assert sorted(manifest["files"]) == sorted(FILES)
    for rel, data in FILES.items():
        assert manifest["files"][rel]["size"] == len(data)
        assert re.fullmatch(r"[0-9a-f]{64}", manifest["files"][rel]["sha256"])
    assert storage.exists(CKPT, MANIFEST)


def test_local_publish_leaves_no_temporary_folders(tmp_path):
    storage = Storage(str(tmp_path / "store"))
    src = write_tree(tmp_path / "src", FILES)
    publish_checkpoint(storage, src, CKPT, {"iteration": 1})
    publish_checkpoint(storage, src, CKPT, {"iteration": 2})
    assert storage.listdir("Trainable_t0") == ["checkpoint_000003"]


def test_republishing_replaces_the_checkpoint(published, tmp_path):
    storage, _ = published
    newer = write_tree(tmp_path / "newer", {"model.bin": b"v2", "other.txt": b"new"})
    publish_checkpoint(storage, newer, CKPT, {"iteration": 7})
    dst = tmp_path / "dst"
    assert fetch_checkpoint(storage, CKPT, str(dst)) == {"iteration": 7}
    assert read_tree(dst) == {"model.bin": b"v2", "other.txt": b"new"}
    assert sorted(read_manifest(storage, CKPT)["files"]) == ["model.bin", "other.txt"]


def test_publishing_a_missing_folder_fails_and_publishes_nothing(storage, tmp_path):
    with pytest.raises(CheckpointError, match="is not a folder"):
        publish_checkpoint(storage, str(tmp_path / "nope"), CKPT, {"iteration": 1})
    assert not storage.exists(CKPT, MANIFEST)


def test_folder_without_manifest_is_not_a_checkpoint(storage, tmp_path):
    storage.write_bytes(b"data", CKPT, "model.bin")
    message = f"checkpoint {re.escape(storage.full_url(CKPT))} has no manifest"
    with pytest.raises(CheckpointError, match=message):
        read_manifest(storage, CKPT)
    with pytest.raises(CheckpointError, match=message):
        fetch_checkpoint(storage, CKPT, str(tmp_path / "dst"))
    with pytest.raises(CheckpointError, match="has no manifest"):
        fetch_checkpoint(storage, "never/published", str(tmp_path / "dst2"))


@pytest.mark.parametrize(
    "manifest, why",
    [(b"{not json", "is corrupt"), (b"[]", "lacks the 'files'"), (b'{"files": {}}', "lacks")],
)
def test_corrupt_manifest_raises_checkpoint_error(published, tmp_path, manifest, why):
    storage, _ = published
    storage.write_bytes(manifest, CKPT, MANIFEST)
    with pytest.raises(CheckpointError, match=f"manifest at .*{CKPT}.* {re.escape(why)}"):
        fetch_checkpoint(storage, CKPT, str(tmp_path / "dst"))


def test_truncated_file_is_detected(published, tmp_path):
    storage, _ = published
    storage.write_bytes(FILES["model.bin"][:-1], CKPT, "model.bin")
    size = len(FILES["model.bin"])
    with pytest.raises(
        CheckpointError,
        match=rf"{re.escape(CKPT)} file 'model.bin' .*size {size - 1}, expected {size}",
    ):
        fetch_checkpoint(storage, CKPT, str(tmp_path / "dst"))


def test_changed_byte_is_detected(published, tmp_path):
    storage, _ = published
    data = bytearray(FILES["optim/state.json"])
    data[3] ^= 0x01
    storage.write_bytes(bytes(data), CKPT, "optim", "state.json")
    with pytest.raises(
        CheckpointError, match=rf"{re.escape(CKPT)} file 'optim/state.json' .*SHA-256"
    ):
        fetch_checkpoint(storage, CKPT, str(tmp_path / "dst"))


def test_missing_file_is_detected(published, tmp_path):
    storage, _ = published
    storage.remove(CKPT, "optim", "deep", "empty")
    with pytest.raises(
        CheckpointError, match=rf"{re.escape(CKPT)} is missing file 'optim/deep/empty'"
    ):
        fetch_checkpoint(storage, CKPT, str(tmp_path / "dst"))


def test_extra_files_are_ignored(published, tmp_path):
    storage, metadata = published
    storage.write_bytes(b"stray", CKPT, "stray.txt")
    dst = tmp_path / "dst"
    assert fetch_checkpoint(storage, CKPT, str(dst)) == metadata
    assert read_tree(dst) == FILES


def test_metadata_is_stored_as_json(published):
    storage, metadata = published
    raw = json.loads(storage.read_bytes(CKPT, MANIFEST))
    assert raw["metadata"] == metadata


def test_a_republish_never_replaces_a_newer_drivers_checkpoint(tmp_path):
    """A publisher stalled past its lease check, woken after a newer driver published the
    same iteration, once moved the newer driver's checkpoint aside and put its own in its
    place (and, killed between, left its own there). Now each driver publishes under its
    own epoch's name: the two stand side by side, and a name of another epoch is refused
    before anything is written."""
    storage = Storage(str(tmp_path / "exp"))
    newer = write_tree(tmp_path / "newer", {"w.bin": b"newer"})
    publish_checkpoint(storage, str(newer), "t/checkpoint_000002_e2", {"epoch": 2})
    stale = write_tree(tmp_path / "stale", {"w.bin": b"stale"})
    publish_checkpoint(storage, str(stale), "t/checkpoint_000002", {"epoch": 1})  # its own
    with pytest.raises(ValueError, match="driver epoch 2's name"):
        publish_checkpoint(storage, str(stale), "t/checkpoint_000002_e2", {"epoch": 1})
    with pytest.raises(ValueError, match="driver epoch 1's name"):
        publish_checkpoint(storage, str(newer), "t/checkpoint_000002", {"epoch": 2})
    exp = tmp_path / "exp" / "t"
    assert (exp / "checkpoint_000002_e2" / "w.bin").read_bytes() == b"newer"
    assert (exp / "checkpoint_000002" / "w.bin").read_bytes() == b"stale"
    assert sorted(p.name for p in exp.iterdir()) == ["checkpoint_000002", "checkpoint_000002_e2"]
    retried = write_tree(tmp_path / "retried", {"w.bin": b"retried"})  # its own retry
    publish_checkpoint(storage, str(retried), "t/checkpoint_000002_e2", {"epoch": 2})
    assert (exp / "checkpoint_000002_e2" / "w.bin").read_bytes() == b"retried"
    assert sorted(p.name for p in exp.iterdir()) == ["checkpoint_000002", "checkpoint_000002_e2"]
