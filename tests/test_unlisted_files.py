"""Nothing a checkpoint's manifest does not list is ever loaded (issue 46, break 6): a
``_dict_checkpoint.pkl`` planted beside a published checkpoint is refused where the
checkpoint is loaded in place, and never copied into a restore folder (a download, the
worker's own copies). Unpickling the planted file would create ``RAN``."""

from __future__ import annotations

import os
import pickle
import uuid

import pytest
from support.trees import read_tree, write_tree

from popflow import Checkpoint
from popflow.infra.storage.folder import Storage
from popflow.infra.store.checkpoints import (
    CheckpointError,
    fetch_checkpoint,
    manifest_digest,
    publish_checkpoint,
    verify_in_place,
)
from popflow.infra.store.layout import DICT_CHECKPOINT_FILE
from popflow.tasks.checkpoint_cache import CheckpointCache
from popflow.tune.utils.mock_trainable import MyTrainableClass

pytestmark = pytest.mark.unit

CKPT = "MyTrainableClass_t0/checkpoint_000002"
FILES = {"checkpoint": b'{"timestep": 2}'}  # what the demo trainable's save_checkpoint writes


class Planted:
    """Unpickled, it creates the file ``path`` (what arbitrary code could do)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def plant(folder: str, marker: str, rel: str = DICT_CHECKPOINT_FILE) -> None:
    write_tree(folder, {rel: pickle.dumps(Planted(marker))})


@pytest.fixture
def published(tmp_path):
    storage = Storage(str(tmp_path / "store"))
    manifest = publish_checkpoint(
        storage, write_tree(tmp_path / "src", FILES), CKPT, {"iteration": 2}
    )
    return storage, manifest


@pytest.mark.parametrize(
    "rel", [DICT_CHECKPOINT_FILE, "sub/extra.bin", ".hidden"], ids=["pickle", "nested", "dot"]
)
def test_a_local_checkpoint_with_an_unlisted_file_is_refused_in_place(published, tmp_path, rel):
    storage, _ = published
    marker = str(tmp_path / "RAN")
    plant(storage.path(CKPT), marker, rel)
    with pytest.raises(CheckpointError, match=rf"does not list: \['{rel}'\]; nothing of it"):
        verify_in_place(storage, CKPT)
    trainable = MyTrainableClass({})
    with pytest.raises(CheckpointError, match="does not list"):
        Checkpoint(storage.path(CKPT)).load_into(trainable)
    with pytest.raises(CheckpointError, match="does not list"):
        Checkpoint(storage.path(CKPT)).to_dict()
    assert not os.path.exists(marker) and not trainable.restored


def test_a_link_planted_in_a_checkpoint_is_refused(published, tmp_path):
    storage, _ = published
    outside = write_tree(tmp_path / "outside", {"x": b"1"})
    os.symlink(outside, os.path.join(storage.path(CKPT), "linked"))
    with pytest.raises(CheckpointError, match=r"does not list: \['linked'\]"):
        verify_in_place(storage, CKPT)


def test_a_clean_checkpoint_still_loads_in_place(published):
    storage, _ = published
    trainable = MyTrainableClass({})
    Checkpoint(storage.path(CKPT)).load_into(trainable)
    assert trainable.restored and trainable.timestep == 2 and trainable.iteration == 2


def test_a_download_holds_exactly_the_listed_files(tmp_path):
    storage = Storage(f"memory://unlisted-{uuid.uuid4().hex}")
    try:
        publish_checkpoint(storage, write_tree(tmp_path / "src", FILES), CKPT, {"iteration": 2})
        storage.write_bytes(
            pickle.dumps(Planted(str(tmp_path / "RAN"))), CKPT, DICT_CHECKPOINT_FILE
        )
        out = tmp_path / "restore"
        fetch_checkpoint(storage, CKPT, str(out))
        assert read_tree(out) == FILES
        trainable = MyTrainableClass({})
        Checkpoint(storage.full_url(CKPT)).load_into(trainable)
        assert trainable.restored and not (tmp_path / "RAN").exists()
    finally:
        storage.remove()


def test_the_workers_copy_gives_only_the_listed_files(published, tmp_path):
    """The worker's own copy of a checkpoint it published, with a pickle planted in it:
    the restore folder gets the manifest's files alone."""
    storage, manifest = published
    cache = CheckpointCache(1 << 20)
    kept = write_tree(tmp_path / "staged", FILES)
    digest = manifest_digest(manifest)
    assert cache.keep(storage, CKPT, kept, digest, manifest)
    (copy,) = [c.folder for c in cache._copies.values()]
    plant(copy, str(tmp_path / "RAN"))
    out = tmp_path / "restore"
    assert cache.copy_to(storage, CKPT, digest, str(out)) == {"iteration": 2}
    assert read_tree(out) == FILES
    trainable = MyTrainableClass({})
    from popflow.tasks.checkpoint import load_folder

    load_folder(trainable, str(out))
    assert trainable.restored and not (tmp_path / "RAN").exists()


# -- links in a checkpoint: never followed ---------------------------------------------------


def _link_listed_file(storage: Storage, target: str) -> None:
    """The listed file ``checkpoint`` of CKPT, made a link to ``target`` (same bytes, so
    its size and digest match the manifest)."""
    listed = os.path.join(storage.path(CKPT), "checkpoint")
    os.remove(listed)
    os.symlink(target, listed)


@pytest.mark.parametrize("where", ["outside", "inside"])
def test_a_listed_file_that_is_a_link_is_refused_in_place(published, tmp_path, where):
    """A link out of the experiment (or anywhere) with the listed digest was checked and
    handed to the trainable, which read the file it points at."""
    storage, _ = published
    if where == "outside":
        target = write_tree(tmp_path / "outside", FILES) + "/checkpoint"
    else:
        storage.write_bytes(FILES["checkpoint"], "elsewhere.bin")
        target = storage.path("elsewhere.bin")
    _link_listed_file(storage, target)
    refused = r"file 'checkpoint' is refused: it is a link; popflow follows no link"
    with pytest.raises(CheckpointError, match=refused):
        verify_in_place(storage, CKPT)
    trainable = MyTrainableClass({})
    with pytest.raises(CheckpointError, match=refused):
        Checkpoint(storage.path(CKPT)).load_into(trainable)
    assert not trainable.restored


def test_a_checkpoint_folder_that_is_a_link_is_refused_in_place(published):
    storage, _ = published
    linked = "MyTrainableClass_t0/checkpoint_000003"
    os.symlink(storage.path(CKPT), storage.path(linked))
    with pytest.raises(CheckpointError, match="its folder is a link"):
        verify_in_place(storage, linked)


def test_a_download_from_local_disk_follows_no_link(published, tmp_path):
    """A link inside the experiment passes the storage's check (it stays inside); the
    download refuses it all the same."""
    storage, _ = published
    storage.write_bytes(FILES["checkpoint"], "elsewhere.bin")
    _link_listed_file(storage, storage.path("elsewhere.bin"))
    with pytest.raises(CheckpointError, match="file 'checkpoint' is refused: it is a link"):
        fetch_checkpoint(storage, CKPT, str(tmp_path / "restore"))


def test_the_workers_copy_follows_no_link(published, tmp_path, caplog):
    """A listed file of the worker's own copy made a link to a file outside with the same
    bytes: the copy is dropped for the store, not copied through the link."""
    storage, manifest = published
    cache = CheckpointCache(1 << 20)
    digest = manifest_digest(manifest)
    assert cache.keep(storage, CKPT, write_tree(tmp_path / "staged", FILES), digest, manifest)
    (copy,) = [c.folder for c in cache._copies.values()]
    victim = write_tree(tmp_path / "victim", FILES) + "/checkpoint"
    os.remove(os.path.join(copy, "checkpoint"))
    os.symlink(victim, os.path.join(copy, "checkpoint"))
    out = tmp_path / "restore"
    assert cache.copy_to(storage, CKPT, digest, str(out)) is None
    assert "file 'checkpoint' is refused: it is a link" in caplog.text
    assert not out.exists() and not cache._copies


def test_a_trial_folder_that_is_a_link_inside_the_experiment_is_refused_in_place(published):
    """The storage lets a link that stays inside by; a checkpoint loaded in place through
    one would be another trial's."""
    storage, _ = published
    os.symlink(storage.path("MyTrainableClass_t0"), storage.path("MyTrainableClass_t1"))
    with pytest.raises(CheckpointError, match="its folder is a link or goes through one"):
        verify_in_place(storage, "MyTrainableClass_t1/checkpoint_000002")
