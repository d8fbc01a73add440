"""Storage through fsspec URLs: a plain path means a local folder, ``s3://`` means S3.

A :class:`Storage` is picklable (URL + options; the filesystem is created
lazily per process), so the driver hands the same object to Dask workers.
Every write that others may read is published atomically:

- local: write to a temporary sibling, then ``os.replace`` (atomic rename);
- object stores: a single PUT is atomic per object, and multi-object
  artefacts (checkpoints) become visible through a manifest written last
  (see :mod:`infra.checkpoint_store`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import uuid
from collections.abc import Iterator
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

logger = logging.getLogger(__name__)


class Storage:
    """A root folder on an fsspec filesystem; paths passed to methods are relative to it."""

    def __init__(self, url: str | os.PathLike[str], storage_options: dict[str, Any] | None = None):
        url = os.fspath(url)
        if not url:
            raise ValueError(
                "`storage` is empty; give a local folder or a URL such as s3://bucket/prefix"
            )
        self.storage_options = dict(storage_options or {})
        fs, root = fsspec.core.url_to_fs(url, **self.storage_options)
        self.protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self.is_local = isinstance(fs, LocalFileSystem)
        self.root = os.path.abspath(root) if self.is_local else root.rstrip("/")
        self._fs: fsspec.AbstractFileSystem | None = fs

    # -- identity and pickling -------------------------------------------------
    @property
    def url(self) -> str:
        return self.root if self.is_local else f"{self.protocol}://{self.root}"

    def __repr__(self) -> str:  # never show storage_options: they may hold credentials
        return f"Storage({self.url!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fs"] = None
        return state

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        if self._fs is None:
            self._fs = fsspec.filesystem(self.protocol, **self.storage_options)
        return self._fs

    def child(self, *parts: str) -> Storage:
        """A Storage rooted at a sub-folder."""
        sub = Storage.__new__(Storage)
        sub.__dict__.update(self.__getstate__())
        sub.root = self.path(*parts)
        sub._fs = self._fs
        return sub

    def path(self, *parts: str) -> str:
        """Absolute filesystem path of ``parts`` under the root."""
        for part in parts:
            if part.startswith("/"):  # posixpath.join would drop the root and escape it
                raise ValueError(
                    f"storage path part {part!r} is absolute; give paths relative to {self.url}"
                )
        return posixpath.join(self.root, *parts) if parts else self.root

    def full_url(self, *parts: str) -> str:
        p = self.path(*parts)
        return p if self.is_local else f"{self.protocol}://{p}"

    # -- reads -------------------------------------------------------------------
    def exists(self, *parts: str) -> bool:
        return self.fs.exists(self.path(*parts))

    def read_bytes(self, *parts: str) -> bytes:
        return self.fs.cat_file(self.path(*parts))

    def read_text(self, *parts: str) -> str:
        return self.read_bytes(*parts).decode("utf-8")

    def size(self, *parts: str) -> int:
        return int(self.fs.size(self.path(*parts)))

    def listdir(self, *parts: str) -> list[str]:
        """Names (not paths) directly under ``parts``; empty if it does not exist."""
        p = self.path(*parts)
        try:
            entries = self.fs.ls(p, detail=False)
        except FileNotFoundError:
            return []
        return sorted(posixpath.basename(e.rstrip("/")) for e in entries)

    def walk_files(self, *parts: str) -> Iterator[str]:
        """Paths of all files under ``parts``, relative to it."""
        base = self.path(*parts)
        for f in sorted(self.fs.find(base)):
            yield posixpath.relpath(f, base)

    # -- writes ------------------------------------------------------------------
    def makedirs(self, *parts: str) -> None:
        if self.is_local:
            os.makedirs(self.path(*parts), exist_ok=True)

    def write_bytes(self, data: bytes, *parts: str, durable: bool = False) -> None:
        """Publish ``data`` atomically: readers see the old object or the new one.

        ``durable``: on local disk, also fsync before the rename, so the object
        survives a machine crash, not only a process crash (commits use it;
        checkpoints rely on their checksums instead, which are checked on load).
        """
        target = self.path(*parts)
        if self.is_local:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            tmp = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                    if durable:
                        f.flush()
                        os.fsync(f.fileno())
                os.replace(tmp, target)
            except BaseException:  # a failed write leaves no temporary file behind
                with contextlib.suppress(OSError):
                    os.remove(tmp)
                raise
        else:
            self.fs.pipe_file(target, data)

    def write_text(self, text: str, *parts: str, durable: bool = False) -> None:
        self.write_bytes(text.encode("utf-8"), *parts, durable=durable)

    def append_text(self, text: str, *parts: str) -> int:
        """Append ``text`` and return the new size in bytes.

        Local files are appended in place; object stores have no append, so
        the object is rewritten whole (fine for the small logs we append to).
        """
        data = text.encode("utf-8")
        target = self.path(*parts)
        if self.is_local:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "ab") as f:
                f.write(data)
                f.flush()
                return f.tell()
        old = self.fs.cat_file(target) if self.fs.exists(target) else b""
        self.fs.pipe_file(target, old + data)
        return len(old) + len(data)

    def truncate(self, length: int, *parts: str) -> None:
        """Cut a file back to ``length`` bytes (used to drop uncommitted appends)."""
        target = self.path(*parts)
        if not self.fs.exists(target):
            return
        if self.is_local:
            if os.path.getsize(target) > length:  # never extend (as on object stores)
                with open(target, "r+b") as f:
                    f.truncate(length)
        else:
            data = self.fs.cat_file(target)
            if len(data) > length:
                self.fs.pipe_file(target, data[:length])

    def put_dir(self, local_dir: str, *parts: str) -> None:
        """Copy a local folder's files under ``parts`` (not atomic on its own)."""
        target = self.path(*parts)
        for dirpath, _dirs, files in os.walk(local_dir):
            for name in files:
                src = os.path.join(dirpath, name)
                rel = os.path.relpath(src, local_dir).replace(os.sep, "/")
                dst = posixpath.join(target, rel)
                if self.is_local:
                    os.makedirs(os.path.dirname(dst), exist_ok=True)
                self.fs.put_file(src, dst)

    def get_dir(self, local_dir: str, *parts: str) -> None:
        """Copy the files under ``parts`` into a local folder."""
        for rel in self.walk_files(*parts):
            dst = os.path.join(local_dir, *rel.split("/"))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            self.fs.get_file(self.path(*parts, rel), dst)

    def rename(self, src: tuple[str, ...], dst: tuple[str, ...]) -> None:
        """Atomic on local disk (os.replace); a copy + delete elsewhere."""
        s, d = self.path(*src), self.path(*dst)
        if self.is_local:
            os.replace(s, d)
        else:
            self.fs.mv(s, d, recursive=True)

    def remove(self, *parts: str) -> None:
        """Delete a file or a folder tree; missing is fine."""
        p = self.path(*parts)
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(p, recursive=True)
