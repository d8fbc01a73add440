"""The Dask cluster: an embedded LocalCluster of process workers, or an existing scheduler."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

from distributed import Client, LocalCluster

logger = logging.getLogger(__name__)


def default_workers() -> int:
    return max(
        1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )


@contextmanager
def dask_client(
    address: str | Client | None = None,
    n_workers: int | None = None,
    resources: dict[str, float] | None = None,
) -> Iterator[Client]:
    """Yield a client: to ``address`` if given, else to a new LocalCluster torn down on exit.

    The embedded cluster uses process workers with one thread each (one trial
    segment per process at a time), one worker per core by default.
    """
    if isinstance(address, Client):
        yield address
        return
    if address:
        with Client(address) as client:
            yield client
        return
    # the embedded scheduler lives in this process; its INFO chatter is not the user's business
    logging.getLogger("distributed").setLevel(logging.WARNING)
    n = n_workers or default_workers()
    if n < 1:
        raise ValueError(f"`n_workers` is {n}, but must be >= 1")
    cluster = LocalCluster(
        n_workers=n,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        resources=resources,
        silence_logs=logging.WARNING,
    )
    try:
        with Client(cluster) as client:
            yield client
    finally:
        cluster.close()


def worker_slots(client: Client) -> int:
    """How many segments can run at once: the cluster's total worker threads."""
    workers = client.scheduler_info(n_workers=-1)["workers"]
    return max(1, sum(w.get("nthreads", 1) for w in workers.values()))


def current_worker_address() -> str | None:
    """The address of the Dask worker running this code (None outside a worker)."""
    from distributed import get_worker

    try:
        return get_worker().address
    except ValueError:
        return None
