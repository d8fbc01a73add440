"""Checkpoint publishes beside training, within one runner call.

Publishing a checkpoint reads every file the trainable wrote to take its
SHA-256 (80 ms for 100 MB here) and, on an object store, uploads it in a few
requests, each a round trip. A runner call with several segments does not
wait for each: the checkpoint is published by a small pool of threads while
the call's next segment trains. On an object store the folder is copied to a
staging folder first (the trainable's own folder is gone or rewritten once
``save_checkpoint`` returns); on local disk it already is one, in the trial's
folder, made visible by a rename. The call returns only when every publish
is done, so the driver never commits a checkpoint that is not in storage; a
segment whose publish failed comes back as an error. Downloads (or, on local
disk, the checks) for the call's trials that restore from a checkpoint start
when the call does (``popflow.tasks.segment``), while its first segments train, or
when it reaches the worker if it waits behind another (``popflow.tasks.restore_fetch``).

A call whose segments ask for it (``SegmentSpec.defer_publish``) returns once they
have trained: its publishes go on here, kept under a token (:func:`defer`), and the
driver waits for them (:func:`settle`) before its commit names them, while the next
round's segments train. A restore of a checkpoint this process is still publishing
waits for that publish (:func:`published_digest`).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import traceback
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

from popflow.infra.helper_threads import InlineExecutor, helpers_inline
from popflow.infra.storage.errors import StorageError
from popflow.infra.storage.folder import Storage
from popflow.infra.store.checkpoints import manifest_digest, publish_checkpoint
from popflow.infra.store.lease import LeaseLost
from popflow.tasks.checkpoint_cache import cache
from popflow.tasks.specs import CheckpointRecord, EndReason, Published, SegmentOutcome

TRANSFER_THREADS = 4  # per worker process, shared by its runners
#: Deferred calls kept unsettled at most (a driver that went away never settles).
MAX_DEFERRED = 256

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_lock = threading.Lock()
#: (storage url, checkpoint path) -> its publish in this process, while it runs
_publishing: dict[tuple[str, str], Future[str]] = {}
_deferred: OrderedDict[str, Uploads] = OrderedDict()


def transfer_threads() -> Executor:
    global _pool
    if helpers_inline():  # a deterministic simulation: transfers run in the segment's thread
        return InlineExecutor()
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(TRANSFER_THREADS, thread_name_prefix="popflow-transfer")
        return _pool


def _publish_staged(
    storage: Storage,
    staged: str,
    rel_path: str,
    metadata: dict[str, Any],
    guard: Callable[[], None] | None,
    known: dict[str, dict[str, Any]] | None,
) -> str:
    """Publish the staged copy, then keep it as this worker's copy of that version (a
    restore here reads it from disk); the published version's digest."""
    if storage.is_local:  # ``staged``: the storage's staging folder, published by a rename
        try:
            manifest = publish_checkpoint(
                storage, storage.path(staged), rel_path, metadata, guard, staged=staged, known=known
            )
        except BaseException:
            storage.remove(staged)  # nothing may see a checkpoint that was not published
            raise
        return manifest_digest(manifest)
    kept = False
    try:
        manifest = publish_checkpoint(storage, staged, rel_path, metadata, guard, known=known)
        digest = manifest_digest(manifest)
        kept = cache.keep(storage, rel_path, staged, digest, manifest)
        return digest
    finally:
        if not kept:
            shutil.rmtree(staged, ignore_errors=True)


class Uploads:
    """The uploads one runner call started; ``finish`` waits for them."""

    def __init__(self) -> None:
        self._pending: list[tuple[SegmentOutcome, CheckpointRecord, Future[str]]] = []

    def submit(
        self,
        outcome: SegmentOutcome,
        record: CheckpointRecord,
        storage: Storage,
        local_dir: str,
        rel_path: str,
        metadata: dict[str, Any],
        guard: Callable[[], None] | None = None,
        known: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """Publish ``local_dir`` as ``rel_path`` in a transfer thread. On local disk
        ``local_dir`` is the storage's staging folder (relative to the storage) and
        becomes the publish's to move or remove; on an object store it is copied first."""
        if storage.is_local:
            staged = local_dir
        else:
            staged = tempfile.mkdtemp(prefix="popflow-upload-")
            try:
                shutil.copytree(local_dir, staged, dirs_exist_ok=True)
            except BaseException:
                shutil.rmtree(staged, ignore_errors=True)
                raise
        future = transfer_threads().submit(
            _publish_staged, storage, staged, rel_path, metadata, guard, known
        )
        key = (storage.url, rel_path)
        with _lock:
            _publishing[key] = future
        future.add_done_callback(lambda f: _published(key, f))
        self._pending.append((outcome, record, future))

    def __bool__(self) -> bool:
        return bool(self._pending)

    def finish(self) -> list[SegmentOutcome]:
        """Wait for every upload; a segment whose upload failed ends in error.

        Returns the outcomes that failed here (their parked trainables, if
        any, must be discarded: the trial goes on from a durable checkpoint).
        """
        pending, self._pending = self._pending, []
        failed: list[SegmentOutcome] = []
        for outcome, record, future in pending:
            try:
                record.digest = future.result()
            except Exception as exc:
                if isinstance(exc, StorageError):  # the run's failure (a full disk, say)
                    outcome.storage_failure = exc
                if isinstance(exc, LeaseLost):  # a newer driver holds the lease
                    outcome.fenced = exc
                if record in outcome.checkpoints:  # not published: the name is not its
                    outcome.checkpoints.remove(record)
                if outcome.reason == EndReason.ERROR:
                    continue
                outcome.reason = EndReason.ERROR
                outcome.error = traceback.format_exc()
                failed.append(outcome)
        return failed

    def settle(self) -> tuple[Published, list[SegmentOutcome]]:
        """Wait for every publish (of a deferred call): what they came to, and the
        outcomes that failed (as :meth:`finish`)."""
        records = [(outcome.trial_id, record) for outcome, record, _ in self._pending]
        failed = self.finish()
        published = Published()
        errors = {o.trial_id: o.error or "its publish failed" for o in failed}
        for trial_id, record in records:
            key = (trial_id, record.name)
            if record.digest is not None and trial_id not in errors:
                published.digests[key] = record.digest
            else:
                published.errors[key] = errors.get(trial_id, "its publish failed")
        published.storage_failure = next(
            (o.storage_failure for o in failed if o.storage_failure is not None), None
        )
        published.fenced = next((o.fenced for o in failed if o.fenced is not None), None)
        return published, failed


def _published(key: tuple[str, str], future: Future[str]) -> None:
    with _lock:
        if _publishing.get(key) is future:
            del _publishing[key]


def published_digest(storage: Storage, rel_path: str) -> str | None:
    """The digest of ``rel_path`` as this process is publishing it, once published; None
    if it is not publishing it (then a restore reads the store), or the publish failed."""
    key = (storage.url, rel_path)
    with _lock:
        running = _publishing.get(key)
        if running is None:
            return None
    try:
        return running.result()
    except Exception:  # the driver hears of it when it settles the call
        return None


def defer(uploads: Uploads) -> str:
    """Keep a call's running publishes for :func:`settle`; the token that names them."""
    token = uuid.uuid4().hex
    with _lock:
        _deferred[token] = uploads
        while len(_deferred) > MAX_DEFERRED:  # nobody settles them: they end unwatched
            _deferred.popitem(last=False)
    return token


def take_deferred(token: str) -> Uploads | None:
    """The publishes kept under ``token`` (None: unknown here, e.g. a restarted worker)."""
    with _lock:
        return _deferred.pop(token, None)
