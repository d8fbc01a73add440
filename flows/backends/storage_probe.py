"""Before a Dask worker trains, it must see the storage the driver writes.

A local folder given as storage is a folder of the driver's machine. A worker on
another machine reads and writes the same path on its own disk: its checkpoints would
scatter over the hosts while the driver, reading its own disk, found none of them. So
the driver writes a fresh token (:data:`~popflow.infra.store.layout.STORAGE_PROBE_FILE`)
and every worker reads it back (:func:`popflow.tasks.storage_probe.read_probe`) before
its runners are made, as it joins: the workers of the first look must all see it, or
the run stops before its first segment (:class:`StorageUnseen`); a worker that joins
later and does not is left out, said once in the log.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable

from distributed import Client

from popflow.infra.storage.folder import Storage
from popflow.infra.store.layout import STORAGE_PROBE_FILE
from popflow.tasks.storage_probe import read_probe

logger = logging.getLogger(__name__)

#: Seconds a worker gets to read the probe (a GET on S3, a stat on local disk).
PROBE_TIMEOUT_S = 120.0


class StorageUnseen(RuntimeError):
    """Dask workers do not see the experiment's storage: the run stops before it trains."""


class StorageProbe:
    """The driver's token in ``storage``; :meth:`unseen` asks workers to read it back."""

    def __init__(self, storage: Storage, guard: Callable[[], None] = lambda: None) -> None:
        """Write a fresh token (``guard``: the lease's check, before the write)."""
        self.storage = storage
        self.token = uuid.uuid4().hex
        guard()
        storage.write_text(json.dumps({"token": self.token}), STORAGE_PROBE_FILE)

    def unseen(self, client: Client, workers: list[str]) -> dict[str, str]:
        """Each of ``workers`` that does not read the token, with what it found instead."""
        futures = {
            w: client.submit(
                read_probe,
                self.storage,
                self.token,
                workers=[w],
                allow_other_workers=False,
                pure=False,
                key=f"popflow-storage-probe-{uuid.uuid4().hex}",
            )
            for w in workers
        }
        found = {}
        for w, future in futures.items():
            try:
                why = future.result(timeout=PROBE_TIMEOUT_S)
            except Exception as exc:  # the worker died meanwhile: the pool drops it
                logger.debug("storage probe on %s: %s: %s", w, type(exc).__name__, exc)
                continue
            if why is not None:
                found[w] = why
        return found

    def refusal(self, unseen: dict[str, str], of: int) -> StorageUnseen:
        """The run's error when ``unseen`` of the ``of`` first workers do not see the storage."""
        first = next(iter(unseen.values()))
        return StorageUnseen(
            f"{len(unseen)} of {of} Dask workers do not see the storage {self.storage.url} "
            f"that this driver writes ({', '.join(sorted(unseen))}: {first}), so their "
            "checkpoints would be written on their own machines' disks and lost to this "
            "run; use storage that every host reaches: S3 (storage='s3://bucket/prefix', "
            "storage_options for its endpoint and credentials) or a folder every host "
            "mounts at the same path (NFS)"
        )
