"""A worker's copies of the checkpoints it published (tasks/checkpoint_cache.py): served
only for the version committed, checked like a download, bounded in bytes."""

from __future__ import annotations

import os

import pytest

from popflow.infra.storage.folder import Storage
from popflow.infra.store.checkpoints import manifest_digest, publish_checkpoint
from popflow.tasks.checkpoint_cache import CheckpointCache

pytestmark = pytest.mark.unit


def staged(tmp_path, name: str, payload: bytes) -> str:
    folder = tmp_path / "staged" / name
    folder.mkdir(parents=True)
    (folder / "model.bin").write_bytes(payload)
    return str(folder)


def publish(storage: Storage, folder: str, rel_path: str) -> tuple[str, dict]:
    manifest = publish_checkpoint(storage, folder, rel_path, {"iteration": 1})
    return manifest_digest(manifest), manifest


def test_a_kept_copy_serves_its_own_version_only(tmp_path):
    storage = Storage(str(tmp_path / "store"))
    cache = CheckpointCache(1 << 20)
    folder = staged(tmp_path, "a", b"x" * 100)
    digest, manifest = publish(storage, folder, "t/checkpoint_000001")
    assert cache.keep(storage, "t/checkpoint_000001", folder, digest, manifest)
    assert not os.path.exists(folder)  # moved, not copied

    out = tmp_path / "restore"
    assert cache.copy_to(storage, "t/checkpoint_000001", digest, str(out)) == {"iteration": 1}
    assert (out / "model.bin").read_bytes() == b"x" * 100
    # another version of that path (a retried segment), an unknown digest, another path
    assert cache.copy_to(storage, "t/checkpoint_000001", "0" * 64, str(tmp_path / "b")) is None
    assert cache.copy_to(storage, "t/checkpoint_000001", None, str(tmp_path / "c")) is None
    assert cache.copy_to(storage, "t/checkpoint_000002", digest, str(tmp_path / "d")) is None


def test_a_damaged_copy_is_dropped_for_the_store(tmp_path, caplog):
    storage = Storage(str(tmp_path / "store"))
    cache = CheckpointCache(1 << 20)
    folder = staged(tmp_path, "a", b"x" * 100)
    digest, manifest = publish(storage, folder, "t/checkpoint_000001")
    cache.keep(storage, "t/checkpoint_000001", folder, digest, manifest)
    (copy,) = [c.folder for c in cache._copies.values()]
    with open(os.path.join(copy, "model.bin"), "r+b") as f:
        f.write(b"y")  # one byte flipped on the worker's disk
    out = tmp_path / "restore"
    assert cache.copy_to(storage, "t/checkpoint_000001", digest, str(out)) is None
    assert "SHA-256 differs" in caplog.text and not out.exists()
    assert not cache._copies and not os.path.exists(copy)


def test_the_least_recently_used_copies_go_past_the_capacity(tmp_path):
    storage = Storage(str(tmp_path / "store"))
    cache = CheckpointCache(250)
    digests = {}
    for i in (1, 2, 3):
        folder = staged(tmp_path, str(i), bytes([i]) * 100)
        path = f"t/checkpoint_00000{i}"
        digests[path], manifest = publish(storage, folder, path)
        if i == 3:  # 1 was used since 2 was kept: 2 is the one to go
            assert cache.copy_to(storage, "t/checkpoint_000001", digests["t/checkpoint_000001"],
                                 str(tmp_path / "r1"))  # fmt: skip
        assert cache.keep(storage, path, folder, digests[path], manifest)
    kept = {path for (_, path) in cache._copies}
    assert kept == {"t/checkpoint_000001", "t/checkpoint_000003"}

    too_big = staged(tmp_path, "big", b"z" * 300)
    digest, manifest = publish(storage, too_big, "t/checkpoint_000004")
    assert not cache.keep(storage, "t/checkpoint_000004", too_big, digest, manifest)
    assert os.path.exists(too_big)  # left for the caller to remove
    assert not CheckpointCache(0).keep(storage, "t/checkpoint_000004", too_big, digest, manifest)
