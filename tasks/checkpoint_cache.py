"""A worker's own copies of the checkpoints it published to an object store.

A trial that restores on the worker that saved its checkpoint (a paused trial resumed
there, a PBT clone of a member that trained there) then reads no byte from the store:
the upload's staging folder is kept here instead of deleted, and a restore whose
committed version (:func:`popflow.infra.store.checkpoints.manifest_digest`) matches the
copy takes it from local disk, checked against its manifest as a download would be. A
checkpoint published again (a retried segment, elsewhere) has another digest, so an
older copy is never used for it. The copies live in one temporary folder per worker
process, removed when it exits, the least recently used going first past
``POPFLOW_CHECKPOINT_CACHE_BYTES`` (default 2 GiB; 0 keeps none).
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from popflow.infra.storage.folder import Storage
from popflow.infra.store.checkpoints import CheckpointError, check_folder, copy_listed

logger = logging.getLogger(__name__)

DEFAULT_BYTES = 2 << 30


@dataclass(frozen=True)
class _Copy:
    folder: str
    digest: str
    manifest: dict[str, Any]
    size: int


class CheckpointCache:
    """Folders kept by :meth:`keep`, found again by :meth:`copy_to` (thread-safe)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._root: str | None = None
        self._copies: OrderedDict[tuple[str, str], _Copy] = OrderedDict()
        self._lock = threading.Lock()
        self._next = 0

    def keep(
        self, storage: Storage, rel_path: str, folder: str, digest: str, manifest: dict[str, Any]
    ) -> bool:
        """Take ``folder`` (moved, not copied) as the copy of ``rel_path``'s version
        ``digest``; False (the folder left alone) when it cannot be kept."""
        size = sum(entry["size"] for entry in manifest["files"].values())
        if size > self.capacity:
            return False
        with self._lock:
            if self._root is None:
                self._root = tempfile.mkdtemp(prefix="popflow-checkpoint-cache-")
                # the copies go with the worker process (its temporary files, not the run's)
                atexit.register(shutil.rmtree, self._root, ignore_errors=True)
            self._next += 1
            target = os.path.join(self._root, str(self._next))
            try:
                os.rename(folder, target)  # both under the temporary folder: no copy
            except OSError:
                return False
            old = self._copies.pop((storage.url, rel_path), None)
            self._copies[(storage.url, rel_path)] = _Copy(target, digest, manifest, size)
            gone = [old] if old is not None else []
            while sum(c.size for c in self._copies.values()) > self.capacity:
                gone.append(self._copies.popitem(last=False)[1])
        for copy in gone:
            shutil.rmtree(copy.folder, ignore_errors=True)
        return True

    def copy_to(
        self, storage: Storage, rel_path: str, digest: str | None, local_dir: str
    ) -> dict[str, Any] | None:
        """Copy the kept version ``digest`` of ``rel_path`` into ``local_dir``, checked;
        its metadata, or None when this worker has no such copy (or it fails its check)."""
        if digest is None:
            return None
        with self._lock:
            copy = self._copies.get((storage.url, rel_path))
            if copy is None or copy.digest != digest:
                return None
            self._copies.move_to_end((storage.url, rel_path))
            try:  # the files its manifest lists, nothing else (never an unlisted pickle)
                copy_listed(copy.folder, local_dir, copy.manifest)
            except (OSError, CheckpointError) as e:  # a link in the copy: refused, not followed
                logger.warning("%s; reading it from storage instead", e)
                self._copies.pop((storage.url, rel_path), None)
                shutil.rmtree(copy.folder, ignore_errors=True)
                shutil.rmtree(local_dir, ignore_errors=True)
                return None
        try:
            check_folder(storage, rel_path, local_dir, copy.manifest)
        except CheckpointError as e:  # the local copy went bad: the store has the truth
            logger.warning("%s; reading it from storage instead", e)
            self.forget(storage, rel_path)
            shutil.rmtree(local_dir, ignore_errors=True)
            return None
        return copy.manifest["metadata"]

    def forget(self, storage: Storage, rel_path: str) -> None:
        with self._lock:
            copy = self._copies.pop((storage.url, rel_path), None)
        if copy is not None:
            shutil.rmtree(copy.folder, ignore_errors=True)


def _capacity() -> int:
    raw = os.environ.get("POPFLOW_CHECKPOINT_CACHE_BYTES", "")
    try:
        return max(0, int(raw)) if raw else DEFAULT_BYTES
    except ValueError:
        logger.warning("POPFLOW_CHECKPOINT_CACHE_BYTES=%r is no byte count: %d used", raw,
                       DEFAULT_BYTES)  # fmt: skip
        return DEFAULT_BYTES


#: This worker process's cache
cache = CheckpointCache(_capacity())
