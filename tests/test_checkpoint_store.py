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
    CheckpointExists,
    fetch_checkpoint,
    manifest_digest,
    publish_checkpoint,
    read_manifest,
    staging_folder,
    verify_in_place,
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
    with pytest.raises(CheckpointExists):
        publish_checkpoint(storage, src, CKPT, {"iteration": 2})
    assert storage.listdir("Trainable_t0") == ["checkpoint_000003"]


def _snapshot(storage: Storage, rel_path: str) -> dict[str, bytes]:
    return {rel: storage.read_bytes(rel_path, rel) for rel in storage.walk_files(rel_path)}


@pytest.mark.parametrize("staged", [False, True], ids=["copied", "staged"])
def test_a_second_publish_of_a_name_fails_and_changes_nothing(storage, tmp_path, staged):
    """Issue 46 (Break A): a stale attempt's late publish of a name once replaced the
    committed checkpoint (local disk: swapped in; object stores: its manifest deleted,
    then written over). Publishing is create-only now: the second publish of
    ``checkpoint_000010_e3`` by epoch 3 fails and the first stays, byte for byte, the
    version its digest names."""
    name, metadata = "T_0/checkpoint_000010_e3", {"iteration": 10, "epoch": 3}
    publish_checkpoint(storage, write_tree(tmp_path / "first", FILES), name, metadata)
    before = _snapshot(storage, name)
    digest = manifest_digest(read_manifest(storage, name))
    files = {"model.bin": b"stale", "other.txt": b"stale"}
    if staged and storage.is_local:  # a segment's save folder, moved into place
        folder = staging_folder(storage, "T_0")
        assert folder is not None
        write_tree(storage.path(folder), files)
        local, kwargs = storage.path(folder), {"staged": folder}
    else:
        local, kwargs = write_tree(tmp_path / "stale", files), {}
    with pytest.raises(CheckpointExists, match=r"is published already.*changed nothing"):
        publish_checkpoint(storage, local, name, {**metadata, "stale": True}, **kwargs)
    assert _snapshot(storage, name) == before
    assert manifest_digest(read_manifest(storage, name)) == digest
    assert fetch_checkpoint(storage, name, str(tmp_path / "dst"), digest) == metadata
    assert read_tree(tmp_path / "dst") == FILES
    assert storage.listdir("T_0") == ["checkpoint_000010_e3"]  # no scratch left


def test_a_restore_refuses_another_version_than_the_committed_one(published, tmp_path):
    """What is stored under a committed name is loaded only if its manifest is the
    version the commit recorded (its digest): another version (written over by hand, or
    by a stale writer of an earlier release) is a damaged checkpoint, never loaded."""
    storage, metadata = published
    committed = manifest_digest(read_manifest(storage, CKPT))
    other = write_tree(tmp_path / "other", {"model.bin": b"other"})
    storage.remove(CKPT)
    publish_checkpoint(storage, other, CKPT, metadata)
    with pytest.raises(CheckpointError, match="not the version its commit names"):
        fetch_checkpoint(storage, CKPT, str(tmp_path / "dst"), committed)
    if storage.is_local:
        with pytest.raises(CheckpointError, match="not the version its commit names"):
            verify_in_place(storage, CKPT, committed)
    mine = manifest_digest(read_manifest(storage, CKPT))
    assert fetch_checkpoint(storage, CKPT, str(tmp_path / "dst2"), mine) == metadata


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
    retried = write_tree(tmp_path / "retried", {"w.bin": b"retried"})  # its own epoch's
    with pytest.raises(CheckpointExists):  # create-only: a retry has names of its own
        publish_checkpoint(storage, str(retried), "t/checkpoint_000002_e2", {"epoch": 2})
    assert (exp / "checkpoint_000002_e2" / "w.bin").read_bytes() == b"newer"
    assert sorted(p.name for p in exp.iterdir()) == ["checkpoint_000002", "checkpoint_000002_e2"]
