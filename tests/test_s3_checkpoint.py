"""Checkpoints on S3 (moto's S3 server): data objects first, the manifest last, verified on fetch."""

from __future__ import annotations

import re
from typing import Any

import pytest
from support.trees import read_tree, write_tree
from test_s3 import BrokenFS, FlakyFS

from popflow.infra.storage.folder import Storage, StorageError
from popflow.infra.store.checkpoints import (
    CheckpointError,
    CheckpointExists,
    fetch_checkpoint,
    manifest_digest,
    publish_checkpoint,
    read_manifest,
)
from popflow.infra.store.layout import MANIFEST

pytestmark = pytest.mark.integration

FILES = {
    "model.bin": bytes(range(256)) * 400,
    "optim/state.json": b'{"lr": 0.1}',
    "optim/deep/empty": b"",
}
CKPT = "Trainable_t0/checkpoint_000003"
METADATA = {"iteration": 3, "time_total_s": 1.5, "result": {"loss": 0.25}}


class RecordingFS:
    """Wraps a filesystem and records the objects written, in order."""

    def __init__(self, fs: Any) -> None:
        self._fs = fs
        self.writes: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._fs, name)
        if name == "pipe_file":
            return lambda path, *a, **k: (self.writes.append(path), attr(path, *a, **k))[1]
        if name == "put_file":
            return lambda lpath, rpath, *a, **k: (
                self.writes.append(rpath),
                attr(lpath, rpath, *a, **k),
            )[1]
        return attr


@pytest.fixture
def reader(s3_server):
    import s3fs

    _, options = s3_server
    return s3fs.S3FileSystem(skip_instance_cache=True, **options)


def test_round_trip_publishes_the_manifest_last(s3, tmp_path, reader):
    recording = RecordingFS(s3.fs)
    s3._fs = recording
    manifest = publish_checkpoint(s3, write_tree(tmp_path / "src", FILES), CKPT, METADATA)
    assert sorted(manifest["files"]) == sorted(FILES)
    written = [w.removeprefix(s3.path(CKPT) + "/") for w in recording.writes]
    assert sorted(written[:-1]) == sorted(FILES) and written[-1] == MANIFEST
    # another client (a worker restoring the trial) fetches and verifies it
    other = Storage(s3.url, s3.storage_options)
    dst = tmp_path / "dst"
    assert fetch_checkpoint(other, CKPT, str(dst)) == METADATA
    assert read_tree(dst) == FILES  # the manifest itself is not copied out
    assert reader.exists(s3.path(CKPT, MANIFEST))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda data: data[:-10],
            r"file 'model.bin' fails its check: size 102390, expected 102400",
        ),
        (lambda data: b"\xff" + data[1:], r"file 'model.bin' fails its check: SHA-256 differs"),
        (lambda data: data + b"more", r"file 'model.bin' fails its check: size 102404"),
    ],
    ids=["truncated", "overwritten", "extended"],
)
def test_damaged_data_object_fails_its_check(s3, tmp_path, reader, damage, message):
    publish_checkpoint(s3, write_tree(tmp_path / "src", FILES), CKPT, METADATA)
    path = s3.path(CKPT, "model.bin")
    reader.pipe_file(path, damage(reader.cat_file(path)))  # another process overwrites it
    with pytest.raises(CheckpointError, match=rf"{re.escape(s3.full_url(CKPT))} {message}"):
        fetch_checkpoint(s3, CKPT, str(tmp_path / "dst"))


def test_deleted_data_object_fails(s3, tmp_path, reader):
    publish_checkpoint(s3, write_tree(tmp_path / "src", FILES), CKPT, METADATA)
    reader.rm(s3.path(CKPT, "optim", "state.json"))
    with pytest.raises(CheckpointError, match=r"is missing file 'optim/state\.json'"):
        fetch_checkpoint(s3, CKPT, str(tmp_path / "dst"))


def test_checkpoint_without_manifest_is_not_visible(s3, tmp_path, reader):
    """A publish that dies before its manifest leaves data objects that no reader uses."""
    s3._fs = BrokenFS(s3.fs, "pipe_file", PermissionError("AccessDenied"))  # the manifest PUT
    with pytest.raises(StorageError, match=rf"storage create of .*{MANIFEST} failed"):
        publish_checkpoint(s3, write_tree(tmp_path / "src", FILES), CKPT, METADATA)
    s3._fs = None
    assert sorted(reader.find(s3.path(CKPT))) == sorted(s3.path(CKPT, f) for f in FILES)
    message = f"checkpoint {re.escape(s3.full_url(CKPT))} has no manifest"
    with pytest.raises(CheckpointError, match=message):
        read_manifest(s3, CKPT)
    with pytest.raises(CheckpointError, match=message):
        fetch_checkpoint(s3, CKPT, str(tmp_path / "dst"))


def test_an_interrupted_publish_shows_nothing_and_leaves_the_name_free(s3, tmp_path, reader):
    v2 = write_tree(tmp_path / "v2", {"model.bin": b"v2", "other.txt": b"new"})
    broken = BrokenFS(s3.fs, "put_file", TimeoutError("connection lost"))
    s3._fs = broken
    with pytest.raises(StorageError, match="gave up after 5 attempts"):
        publish_checkpoint(s3, v2, CKPT, {"iteration": 2})
    s3._fs = None
    with pytest.raises(CheckpointError, match="has no manifest"):
        fetch_checkpoint(s3, CKPT, str(tmp_path / "dst"))
    publish_checkpoint(s3, v2, CKPT, {"iteration": 2})  # no manifest: nothing published
    assert fetch_checkpoint(s3, CKPT, str(tmp_path / "dst2")) == {"iteration": 2}
    assert read_tree(tmp_path / "dst2") == {"model.bin": b"v2", "other.txt": b"new"}
    s3.remove(CKPT)
    assert reader.find(s3.path(CKPT)) == []


class DeletesRecorded(RecordingFS):
    """:class:`RecordingFS` that also records every delete."""

    def __init__(self, fs: Any) -> None:
        super().__init__(fs)
        self.deletes: list[str] = []

    def __getattr__(self, name: str) -> Any:
        attr = super().__getattr__(name)
        if name in ("rm", "rm_file", "_rm", "_rm_file"):
            return lambda path, *a, **k: (self.deletes.append(str(path)), attr(path, *a, **k))[1]
        return attr


def test_a_second_publish_of_a_name_fails_and_changes_nothing(s3, tmp_path, reader):
    """Issue 46 (Break A) on S3: a stale attempt's late publish of a committed name
    DELETEd its manifest, uploaded over its data objects and PUT its own manifest (a kill
    between lost the committed checkpoint). Now it looks first and stops: no DELETE, no
    upload, the committed objects byte for byte as they were."""
    name, metadata = "T_0/checkpoint_000010_e3", {"iteration": 10, "epoch": 3}
    publish_checkpoint(s3, write_tree(tmp_path / "first", FILES), name, metadata)
    before = {p: reader.cat_file(p) for p in reader.find(s3.path(name))}
    digest = manifest_digest(read_manifest(s3, name))
    recording = DeletesRecorded(s3.fs)
    s3._fs = recording
    stale = write_tree(tmp_path / "stale", {"model.bin": b"stale", "other.txt": b"stale"})
    with pytest.raises(CheckpointExists, match=r"is published already.*changed nothing"):
        publish_checkpoint(s3, stale, name, {**metadata, "stale": True})
    s3._fs = None
    assert recording.writes == [] and recording.deletes == []
    assert {p: reader.cat_file(p) for p in reader.find(s3.path(name))} == before
    assert fetch_checkpoint(s3, name, str(tmp_path / "dst"), digest) == metadata


def test_of_two_publishes_racing_for_a_name_one_wins_and_the_other_changes_no_manifest(
    s3, tmp_path, reader
):
    """Both looked before either published: the manifest's conditional PUT (If-None-Match)
    lets only the first one's manifest land; the second fails and the first's manifest,
    the checkpoint's existence and version, stays."""
    name = "T_0/checkpoint_000010_e3"
    first = write_tree(tmp_path / "first", {"model.bin": b"first"})
    second = write_tree(tmp_path / "second", {"model.bin": b"second"})

    class LooksTooEarly:
        """The second publisher's store: its look finds no manifest (it looked before the
        first one published), and the first one publishes just after that look."""

        def __init__(self, fs: Any) -> None:
            self._fs = fs

        def __getattr__(self, attr: str) -> Any:
            found = getattr(self._fs, attr)
            if attr == "call_s3":

                def call(method: str, *a: Any, **k: Any) -> Any:
                    if method != "head_object":
                        return found(method, *a, **k)
                    s3._fs = None
                    publish_checkpoint(s3, first, name, {"iteration": 10, "epoch": 3})
                    s3._fs = self
                    raise FileNotFoundError(k.get("Key"))

                return call
            return found

    s3._fs = LooksTooEarly(s3.fs)
    with pytest.raises(CheckpointExists):
        publish_checkpoint(s3, second, name, {"iteration": 10, "epoch": 3, "stale": True})
    s3._fs = None
    assert read_manifest(s3, name)["metadata"] == {"iteration": 10, "epoch": 3}


def test_publish_and_fetch_through_a_flaky_connection(s3, tmp_path):
    flaky = FlakyFS(s3.fs, fraction=0.4, seed=7)
    s3._fs = flaky
    publish_checkpoint(s3, write_tree(tmp_path / "src", FILES), CKPT, METADATA)
    assert fetch_checkpoint(s3, CKPT, str(tmp_path / "dst")) == METADATA
    assert read_tree(tmp_path / "dst") == FILES
    assert flaky.injected >= 3
