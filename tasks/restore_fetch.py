"""Downloads of the checkpoints segments restore from, on an object store.

A runner call downloads the checkpoints its cold trials restore from while its first
segments train (:func:`popflow.tasks.segment.run_segments`). A call that waits on its
runner behind another starts them earlier, when it reaches the worker
(:func:`fetch_early`, asked for by the driver): a synchronous PBT round's clones are
sent once the last round's checkpoints are stored and queue behind the round's other
segments, and the download of a 100 MB checkpoint from moto's server, beside the
other worker's uploads, took 2.3-2.6 s of a 10 s round that waited for it. Started
early, it runs while the calls ahead train. The first segment here that restores that
version takes it (:func:`take_early`); a download nobody took is dropped once
``MAX_EARLY`` newer ones wait, or when the process exits.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any

from popflow.infra.storage.folder import Storage
from popflow.infra.store.checkpoints import fetch_checkpoint
from popflow.tasks.checkpoint_cache import cache
from popflow.tasks.uploads import published_digest, transfer_threads

#: Early downloads kept at most on one worker process, waiting for their segments.
MAX_EARLY = 8

Fetched = tuple[str | None, dict[str, Any] | None]  # (temporary folder, checkpoint metadata)
_Key = tuple[str, str, str]  # (storage url, checkpoint path, its version's digest)

_lock = threading.Lock()
_early: OrderedDict[_Key, Future[Fetched]] = OrderedDict()


def fetch(storage: Storage, rel_path: str | None, digest: str | None) -> Fetched:
    """Download ``rel_path`` into a new temporary folder (``<tmp>/checkpoint``);
    (None, None) for a segment that starts from scratch."""
    if rel_path is None:
        return None, None
    tmp = tempfile.mkdtemp(prefix="popflow-restore-")
    target = os.path.join(tmp, "checkpoint")
    try:
        # this worker's own copy of the committed version (or of the one it is still
        # publishing: the driver sent the segment before it knew the digest), else a download
        digest = digest or published_digest(storage, rel_path)
        metadata = cache.copy_to(storage, rel_path, digest, target)
        if metadata is None:
            metadata = fetch_checkpoint(storage, rel_path, target, digest)
        return tmp, metadata
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def drop_fetched(future: Future[Fetched]) -> None:
    """Remove what a download nobody uses wrote, once it ends."""
    future.add_done_callback(_remove)


def _remove(future: Future[Fetched]) -> None:
    if future.exception() is None and (tmp := future.result()[0]) is not None:
        shutil.rmtree(tmp, ignore_errors=True)


def fetch_early(storage: Storage, rel_path: str, digest: str) -> Future[Fetched]:
    """Start downloading version ``digest`` of ``rel_path`` for a segment queued here
    (unless it is already); the download."""
    key = (storage.url, rel_path, digest)
    with _lock:
        if key in _early:
            return _early[key]
        started = _early[key] = transfer_threads().submit(fetch, storage, rel_path, digest)
        dropped = []
        while len(_early) > MAX_EARLY:
            dropped.append(_early.popitem(last=False)[1])
    for future in dropped:
        drop_fetched(future)
    return started


def take_early(
    storage: Storage, rel_path: str | None, digest: str | None
) -> Future[Fetched] | None:
    """The early download of that version, if one was started here and not yet taken."""
    if rel_path is None or digest is None:
        return None
    with _lock:
        return _early.pop((storage.url, rel_path, digest), None)


@atexit.register
def _drop_all() -> None:
    with _lock:
        futures = list(_early.values())
        _early.clear()
    for future in futures:
        if future.done():
            _remove(future)
