"""The Dask cluster: an embedded LocalCluster of process workers, or an existing scheduler."""

from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from distributed import Client, LocalCluster

logger = logging.getLogger(__name__)


def default_workers() -> int:
    return max(
        1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )


def detect_gpus() -> int:
    """GPUs on this machine, as ``nvidia-smi -L`` lists them (0 without it)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def embedded_resources(n_workers: int) -> dict[str, float]:
    """What each embedded worker offers: its share of the cores and of the GPUs."""
    resources = {"CPU": max(1.0, default_workers() / n_workers)}
    gpus = detect_gpus()
    if gpus:
        resources["GPU"] = gpus / n_workers
    return resources


def _embedded_workers(n_workers: int | None) -> int:
    n = n_workers or default_workers()
    if n < 1:
        raise ValueError(f"`n_workers` is {n}, but must be >= 1")
    return n


def _local_cluster(n: int) -> LocalCluster:
    """The embedded cluster: ``n`` process workers with one thread each (one
    segment per process at a time), each declaring its share of the machine
    as Dask resources ``CPU`` and ``GPU``."""
    # the embedded scheduler lives in this process; its INFO chatter is not the user's business
    logging.getLogger("distributed").setLevel(logging.WARNING)
    return LocalCluster(
        n_workers=n,
        threads_per_worker=1,
        processes=True,
        dashboard_address=":0",  # a free port: never collide with another cluster's 8787
        resources=embedded_resources(n),
        silence_logs=logging.WARNING,
    )


class ClusterStart:
    """The embedded LocalCluster, starting in a background thread.

    ``popflow.run`` starts it before it creates its Prefect flow run, so the workers'
    start-up (~0.7-1.3 s here) overlaps the flow run's creation; the flow
    waits for it when it first needs the cluster. The starter closes it.
    """

    def __init__(self, n_workers: int | None = None) -> None:
        self.n_workers = _embedded_workers(n_workers)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="popflow-cluster-start")
        self._future = self._thread.submit(_local_cluster, self.n_workers)

    def cluster(self) -> LocalCluster:
        return self._future.result()

    def close(self) -> None:
        try:
            cluster = self._future.result()
        except Exception:
            return  # it never started; the flow has raised why
        finally:
            self._thread.shutdown()
        cluster.close()

    def __repr__(self) -> str:
        return f"<embedded LocalCluster of {self.n_workers} workers>"


@contextmanager
def dask_client(
    address: str | Client | ClusterStart | None = None,
    n_workers: int | None = None,
) -> Iterator[Client]:
    """Yield a client: to ``address`` if given, else to a new LocalCluster torn down on exit
    (see :func:`_local_cluster`; one worker per core by default)."""
    if isinstance(address, Client):
        yield address
        return
    if isinstance(address, ClusterStart):
        with Client(address.cluster()) as client:
            yield client
        return
    if address:
        with Client(address) as client:
            yield client
        return
    cluster = _local_cluster(_embedded_workers(n_workers))
    try:
        with Client(cluster) as client:
            yield client
    finally:
        cluster.close()


def dask_resources(per_trial: Mapping[str, float] | None) -> dict[str, float] | None:
    """``resources_per_trial`` (Ray's names: cpu, gpu, or any custom resource) as Dask's."""
    if not per_trial:
        return None
    out = {}
    for name, amount in per_trial.items():
        if not isinstance(amount, (int, float)) or amount < 0:
            raise ValueError(
                f"`resources_per_trial[{name!r}]` is {amount!r}, but must be a number >= 0"
            )
        if amount:
            out[{"cpu": "CPU", "gpu": "GPU"}.get(name.lower(), name)] = float(amount)
    return out or None


def slots_per_worker(
    client: Client, resources: Mapping[str, float] | None = None
) -> dict[str, int]:
    """How many segments each worker can run at once, by worker address.

    Without ``resources``: the worker's threads. With them: how many trials
    fit in what the worker offers. Raises ValueError when no worker can hold
    one trial, instead of letting its segments wait forever.
    """
    workers = client.scheduler_info(n_workers=-1)["workers"]
    slots = {}
    for address, w in workers.items():
        n = w.get("nthreads", 1)
        if resources:
            offered = w.get("resources", {})
            n = min(n, min(math.floor(offered.get(k, 0) / v) for k, v in resources.items()))
        if n > 0:
            slots[address] = n
    if workers and not slots:
        offers = sorted({str(w.get("resources", {})) for w in workers.values()})
        raise ValueError(
            f"no Dask worker can run a trial needing {resources}; workers offer {', '.join(offers)}. "
            "Ask for less, use fewer embedded workers (n_workers), or point dask_address at "
            "workers started with matching --resources"
        )
    return slots


def current_worker_address() -> str | None:
    """The address of the Dask worker running this code (None outside a worker)."""
    from distributed import get_worker

    try:
        return get_worker().address
    except ValueError:
        return None
