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

import copy
import json
import logging
import uuid
from collections.abc import Callable

from distributed import Client

from popflow.infra.cluster.scheduler_link import cluster_workers
from popflow.infra.storage.folder import Storage
from popflow.infra.storage.retry import RetryPolicy
from popflow.infra.store.layout import STORAGE_PROBE_FILE
from popflow.tasks.storage_probe import probe_on_worker

logger = logging.getLogger(__name__)

#: Seconds a worker's read of the probe may take: a GET on S3, a read on a mounted folder
#: (its retries take up to 30 s, RetryPolicy's default); a worker that joins mid-run holds
#: the round's start that long at most, once.
PROBE_TIMEOUT_S = 60.0


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
        """Each of ``workers`` that does not read the token, with what it found instead. A
        worker's read that does not end within ``PROBE_TIMEOUT_S`` (a hung mount) does not
        see it either; one that left the cluster meanwhile is not counted. The read runs
        beside the worker's tasks (``Client.run``), so a busy worker answers at once."""
        # the probe's read retries as storage calls do by default, not for a whole lease
        storage = copy.copy(self.storage)
        storage.retry = RetryPolicy()
        answers = client.run(
            probe_on_worker,
            storage,
            self.token,
            PROBE_TIMEOUT_S,
            workers=workers,
            on_error="return",
        )
        present = cluster_workers(client)
        found = {}
        for w in workers:
            why = answers.get(w)
            if isinstance(why, BaseException):
                if w not in present:
                    logger.debug("storage probe on %s: it left: %s", w, why)
                    continue
                why = f"asking it failed: {type(why).__name__}: {why}"
            elif w not in answers:
                continue  # it left before it was asked
            if why is not None:
                found[w] = why
        return found

    def refusal(self, unseen: dict[str, str], of: int) -> StorageUnseen:
        """The run's error when ``unseen`` of the ``of`` first workers do not see the storage."""
        reasons = "; ".join(
            f"{', '.join(sorted(w for w, r in unseen.items() if r == why))}: {why}"
            for why in dict.fromkeys(unseen.values())
        )
        return StorageUnseen(
            f"{len(unseen)} of {of} Dask workers do not see the storage {self.storage.url} "
            f"that this driver writes ({reasons}), so their "
            "checkpoints would be written on their own machines' disks and lost to this "
            "run; use storage that every host reaches: S3 (storage='s3://bucket/prefix', "
            "storage_options for its endpoint and credentials) or a folder every host "
            "mounts at the same path (NFS)"
        )
