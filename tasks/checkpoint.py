"""The user-facing checkpoint handle (Ray's ``Checkpoint``): a folder, local or on storage."""

from __future__ import annotations

import json
import os
import pickle
import posixpath
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from popflow.infra.storage.credentials import StorageOptions, without_secrets
from popflow.infra.storage.folder import Storage
from popflow.infra.store.checkpoints import fetch_checkpoint, verify_in_place
from popflow.infra.store.layout import DICT_CHECKPOINT_FILE, MANIFEST

#: Where a checkpoint keeps its metadata, in its folder (Ray's name: the same file)
METADATA_FILE = ".metadata.json"


class Checkpoint:
    """A checkpoint folder at ``path`` (a local folder or an fsspec URL), Ray's
    ``ray.train.Checkpoint``: ``filesystem`` (fsspec's here, pyarrow's in Ray), ``path``
    (here a remote one keeps its URL: ``s3://bucket/...``; Ray strips the scheme), and
    ``get_metadata``/``set_metadata``/``update_metadata``.

    Its ``storage_options`` never show in its repr, and its pickled form (what
    Prefect stores of a parameter or result, what Dask sends) leaves out every
    credential.

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> ckpt = Checkpoint.from_directory(d)
    >>> ckpt.path == d
    True
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        filesystem: fsspec.AbstractFileSystem | None = None,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        path = os.fspath(path)
        self._fs: fsspec.AbstractFileSystem | None = None  # made from path on first use
        if filesystem is not None:
            if not isinstance(filesystem, fsspec.AbstractFileSystem):
                raise TypeError(
                    f"`filesystem` is {type(filesystem).__name__}, but popflow takes an fsspec "
                    "filesystem (Ray takes pyarrow's); or give a URL and `storage_options`"
                )
            if storage_options is not None:
                raise ValueError("give `filesystem` or `storage_options`, not both")
            # a path on that filesystem (Ray's): kept as the URL it stands for
            if "://" not in path and not isinstance(filesystem, LocalFileSystem):
                path = filesystem.unstrip_protocol(path)
            storage_options = dict(filesystem.storage_options) or None
            self._fs = filesystem
        # like Ray (pyarrow's from_uri): a file:// URL is kept as the plain local path
        self.path = path[len("file://") :] if path.startswith("file://") else path
        self._options = StorageOptions(storage_options)  # credentials: never in the clear

    @property
    def filesystem(self) -> fsspec.AbstractFileSystem:
        """The fsspec filesystem the checkpoint is on (Ray's is a pyarrow filesystem);
        with :attr:`path` it reaches the checkpoint's files."""
        if self._fs is None:
            self._fs = fsspec.core.url_to_fs(self.path, **self.storage_options)[0]
        return self._fs

    def _fs_path(self, *parts: str) -> str:
        root = self.path if self.is_local else self.filesystem._strip_protocol(self.path)
        return posixpath.join(root.rstrip("/"), *parts)

    def get_metadata(self) -> dict[str, Any]:
        """The metadata kept with the checkpoint (Ray's: ``.metadata.json`` in its folder,
        so it travels with it: to storage, back, and into a PBT clone); {} if none."""
        fs, path = self.filesystem, self._fs_path(METADATA_FILE)
        if not fs.exists(path):
            return {}
        with fs.open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))

    def set_metadata(self, metadata: dict[str, Any]) -> None:
        """Keep ``metadata`` (a JSON-able dict) with the checkpoint, replacing what was
        kept. Set it before the checkpoint is reported: a checkpoint popflow has published
        never changes (its files are checked against its manifest when it is loaded)."""
        if not isinstance(metadata, dict):
            raise TypeError(f"`metadata` must be a dict, got {type(metadata).__name__}")
        data = json.dumps(metadata).encode("utf-8")  # TypeError for what JSON cannot hold
        fs = self.filesystem
        if fs.exists(self._fs_path(MANIFEST)):
            raise ValueError(
                f"checkpoint {self.path} is published, and a published checkpoint never "
                "changes: set its metadata before reporting it, or on a copy "
                "(Checkpoint.from_directory(checkpoint.to_directory()))"
            )
        with fs.open(self._fs_path(METADATA_FILE), "wb") as f:
            f.write(data)

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        """:meth:`set_metadata` with the kept metadata updated by ``metadata``."""
        if not isinstance(metadata, dict):
            raise TypeError(f"`metadata` must be a dict, got {type(metadata).__name__}")
        self.set_metadata({**self.get_metadata(), **metadata})

    @property
    def storage_options(self) -> dict[str, Any]:
        """The fsspec options to read a remote checkpoint (credentials: never log them)."""
        return self._options.value

    def __getstate__(self) -> dict[str, Any]:
        # a checkpoint handed on (a Prefect parameter or result, a pickle) carries no
        # credentials: where it is read again they come from the AWS chain, or from
        # storage_options given anew
        return {"path": self.path, "options": without_secrets(self.storage_options)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self._options = StorageOptions(state["options"])
        self._fs = None

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str]) -> Checkpoint:
        return cls(os.path.abspath(os.fspath(path)))

    @property
    def is_local(self) -> bool:
        return "://" not in self.path

    def to_directory(self, path: str | None = None) -> str:
        """Copy the checkpoint's files into ``path`` (a new temporary folder if None);
        return it. The copy is the user's: popflow's manifest stays behind."""
        target = path or tempfile.mkdtemp(prefix="popflow-ckpt-")
        os.makedirs(target, exist_ok=True)
        if self.is_local:
            top = os.path.abspath(self.path)

            def manifest(folder: str, names: list[str]) -> list[str]:
                # the top folder's only: a user's file of that name deeper down is copied
                return [MANIFEST] if os.path.abspath(folder) == top else []

            shutil.copytree(self.path, target, dirs_exist_ok=True, ignore=manifest)
        else:
            # through popflow's storage: retried, and verified against the manifest
            parent, name = posixpath.split(self.path.rstrip("/"))
            storage = Storage(parent, self.storage_options)
            if storage.exists(name, MANIFEST):
                fetch_checkpoint(storage, name, target)
            else:
                storage.get_dir(target, name)
        return target

    @contextmanager
    def as_directory(self) -> Iterator[str]:
        """A local folder with the checkpoint's files, for reading only."""
        if self.is_local:
            yield self.path
            return
        tmp = self.to_directory()
        try:
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @contextmanager
    def _checked_directory(self) -> Iterator[str]:
        """:meth:`as_directory`, a checkpoint popflow published verified against its
        manifest first (sizes and SHA-256, as on a download): its dict is unpickled."""
        if self.is_local:
            parent, name = os.path.split(self.path.rstrip("/"))
            storage = Storage(parent)
            if storage.file_exists(name, MANIFEST):
                verify_in_place(storage, name)
        with self.as_directory() as d:
            yield d

    def to_dict(self) -> dict[str, Any]:
        """The dict a class trainable's ``save_checkpoint`` returned."""
        with self._checked_directory() as d:
            dict_file = os.path.join(d, DICT_CHECKPOINT_FILE)
            if not os.path.exists(dict_file):
                raise ValueError(
                    f"checkpoint {self.path} holds no dict (save_checkpoint wrote files "
                    "instead of returning a dict); read its files with as_directory()"
                )
            with open(dict_file, "rb") as f:
                return pickle.load(f)

    def load_into(self, trainable: Any) -> None:
        """Restore ``trainable`` (a :class:`popflow.tune.Trainable`) from this checkpoint:
        its ``load_checkpoint`` gets the dict its ``save_checkpoint`` returned, or the
        folder; its ``iteration`` becomes the checkpoint's."""
        with self._checked_directory() as d:
            load_folder(trainable, d)
            manifest = os.path.join(d, MANIFEST)
            if os.path.exists(manifest):
                with open(manifest) as f:
                    trainable._iteration = int(json.load(f)["metadata"].get("iteration", 0))

    def __repr__(self) -> str:
        return f"Checkpoint({self.path!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Checkpoint) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)


def load_folder(trainable: Any, folder: str) -> None:
    """``trainable.load_checkpoint`` with what ``save_checkpoint`` left in ``folder``."""
    dict_file = os.path.join(folder, DICT_CHECKPOINT_FILE)
    if os.path.exists(dict_file):
        with open(dict_file, "rb") as f:
            trainable.load_checkpoint(pickle.load(f))
    else:
        trainable.load_checkpoint(folder)
