"""The Dask cluster: an embedded LocalCluster of process workers, or an existing scheduler."""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import os
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, NamedTuple

from distributed import Client, LocalCluster

from popflow.infra.cluster.gpus import CUDA_VISIBLE_DEVICES, detect_gpus, visible_devices
from popflow.infra.cluster.scheduler_link import (
    SchedulerUnreachable,
    close_client,
    cluster_workers,
)
from popflow.infra.cluster.worker_close_logs import DEAD_WORKER_BROADCAST
from popflow.infra.cluster.worker_main import WITHOUT_MAIN

logger = logging.getLogger(__name__)


#: The cores the embedded cluster cuts into workers (None: this machine's); ``popflow.init``.
_CORES: int | None = None


#: The GPUs the embedded cluster shares out (None: ``nvidia-smi``'s count).
_GPUS: int | None = None


def use_cores(cores: int | None, gpus: int | None = None) -> None:
    """Ray's ``ray.init(num_cpus=N, num_gpus=G)``: embedded clusters started after this
    use ``cores`` CPUs and ``gpus`` GPUs (None: the machine's)."""
    global _CORES, _GPUS
    _CORES, _GPUS = cores, gpus


def gpus_available() -> int:
    """The GPUs the embedded cluster uses: :func:`use_cores`'s, else the machine's."""
    return _GPUS if _GPUS is not None else detect_gpus()


def default_workers() -> int:
    """The cores the embedded cluster uses: :func:`use_cores`'s, else this machine's."""
    if _CORES is not None:
        return _CORES
    return machine_cores()


#: Embedded worker processes per core, at most: more only wait for the cores, each one
#: a process of its own (Dask's LocalCluster would start any number, until memory ran out).
MAX_WORKERS_PER_CORE = 4
#: Memory one embedded worker process needs before any trial (measured: ~70 MB for
#: Python, Dask and popflow's runner); the machine's memory bounds the workers by it.
WORKER_MEMORY = 128 * 2**20
#: GPUs ``popflow.init(num_gpus=...)`` may declare beyond those this machine has
#: (logical GPUs, as Ray's: a test of the pinning needs none).
MAX_LOGICAL_GPUS = 16


def machine_cores() -> int:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def machine_memory() -> int:
    """Bytes of memory this process's workers may use: Dask's limit (the machine's, a
    cgroup's or ``RLIMIT_RSS``), less if ``RLIMIT_AS`` is lower."""
    from distributed.system import MEMORY_LIMIT

    limit = int(MEMORY_LIMIT)
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        return limit
    return min(limit, soft) if soft > 0 else limit


def max_embedded_workers() -> int:
    """The most worker processes the embedded cluster starts on this machine: at most
    :data:`MAX_WORKERS_PER_CORE` per core, and :data:`WORKER_MEMORY` each in memory."""
    by_cores = machine_cores() * MAX_WORKERS_PER_CORE
    return max(1, min(by_cores, machine_memory() // WORKER_MEMORY))


def check_embedded_workers(argument: str, n: int) -> None:
    """ValueError naming ``argument`` unless the embedded cluster can start ``n``
    worker processes here (:func:`max_embedded_workers`); checked before the run
    writes anything or starts a process."""
    limit = max_embedded_workers()
    if n > limit:
        raise ValueError(
            f"`{argument}` is {n}, but must be between 1 and {limit} on this machine: the "
            f"embedded cluster starts one process per worker, at most {MAX_WORKERS_PER_CORE} "
            f"per core ({machine_cores()} cores) and {WORKER_MEMORY // 2**20} MiB each "
            f"({machine_memory() / 2**30:.1f} GiB of memory); for more, start a Dask "
            "cluster of your own and pass its address as `dask_address`"
        )


def check_gpus(argument: str, gpus: int) -> None:
    """ValueError naming ``argument`` if ``gpus`` is more than this machine's GPUs and more
    than :data:`MAX_LOGICAL_GPUS` (each is a device name handed to workers)."""
    if gpus > MAX_LOGICAL_GPUS:
        found = detect_gpus()
        if gpus > found:
            raise ValueError(
                f"`{argument}` is {gpus}, but must be between 0 and "
                f"{max(found, MAX_LOGICAL_GPUS)}: this machine has {found} GPUs, and at most "
                f"{MAX_LOGICAL_GPUS} may be declared beyond them"
            )


class EmbeddedSize(NamedTuple):
    """How the embedded cluster is cut: ``n_workers`` processes, each offering ``resources``;
    for GPU trials, worker ``i`` sees only ``devices[i]`` (its ``CUDA_VISIBLE_DEVICES``)."""

    n_workers: int
    resources: dict[str, float]
    devices: tuple[tuple[str, ...], ...] = ()


def embedded_size(
    cores: int,
    trial_cpu: float | None,
    n_workers: int | None,
    gpus: int = 0,
    trial_gpu: float | None = None,
    grow: bool = False,
) -> EmbeddedSize:
    """Cut ``cores`` into workers so that a trial needing ``trial_cpu`` CPUs fits one, as
    in Ray, where such a trial fits whenever it fits the machine.

    ``n = n_workers`` if given (the user's choice; a trial too big for it fails
    fast in :func:`slots_per_worker`), else ``n = max(1, floor(cores / trial_cpu))``
    for ``trial_cpu > 1``, else one worker per core; a trial needing ``trial_gpu``
    GPUs caps ``n`` at ``floor(gpus / trial_gpu)`` (one GPU trial per worker for
    ``gpu: 1`` on one GPU, two sharing it for ``gpu: 0.5``). Each worker offers
    ``CPU = max(1, cores / n)`` and ``GPU = gpus / n``; for GPU trials, each worker
    is pinned to its share of the devices (dask-cuda's pattern): ``gpus / n`` devices
    of its own, or one device shared by ``n / gpus`` workers.

    >>> embedded_size(2, 2.0, None)
    EmbeddedSize(n_workers=1, resources={'CPU': 2.0}, devices=())
    >>> embedded_size(16, 1.5, None, gpus=2)
    EmbeddedSize(n_workers=10, resources={'CPU': 1.6, 'GPU': 0.2}, devices=())
    >>> embedded_size(2, None, None, gpus=1, trial_gpu=1.0)
    EmbeddedSize(n_workers=1, resources={'CPU': 2.0, 'GPU': 1.0}, devices=(('0',),))
    >>> embedded_size(8, None, None, gpus=2, trial_gpu=0.5).devices
    (('0',), ('0',), ('1',), ('1',))

    ``grow`` (a ResourceChangingScheduler's run, whose trials may grow up to the whole
    machine): as many workers, each offering every core and GPU, and seeing every
    device; popflow's scheduler, not Dask, keeps the running trials within the machine
    (Dask counts per worker, and a trial runs in one worker's slot).

    >>> embedded_size(8, None, None, grow=True)
    EmbeddedSize(n_workers=8, resources={'CPU': 8.0}, devices=())
    """
    if n_workers is not None:
        n = n_workers
    elif trial_cpu is not None and trial_cpu > 1:
        n = max(1, math.floor(cores / trial_cpu))
    else:
        n = cores
    if n_workers is None and trial_gpu and gpus:
        n = min(n, max(1, math.floor(gpus / trial_gpu)))
    if n < 1:
        raise ValueError(f"`n_workers` is {n}, but must be >= 1")
    if grow:
        return EmbeddedSize(n, {"CPU": float(cores), **({"GPU": float(gpus)} if gpus else {})})
    resources = {"CPU": max(1.0, cores / n)}
    if gpus:
        resources["GPU"] = gpus / n
    if not (trial_gpu and gpus):
        return EmbeddedSize(n, resources)
    return EmbeddedSize(n, resources, _pinned(visible_devices(gpus), n))


def _pinned(devices: list[str], n: int) -> tuple[tuple[str, ...], ...]:
    """``devices`` shared out to ``n`` workers: whole devices each while there are enough,
    else each device to ``n / len(devices)`` workers."""
    if n <= len(devices):
        k = len(devices) // n
        return tuple(tuple(devices[i * k : (i + 1) * k]) for i in range(n))
    return tuple((devices[i * len(devices) // n],) for i in range(n))


def _cpu(trial: Mapping[str, float] | None) -> float | None:
    return (trial or {}).get("CPU")


def _gpu(trial: Mapping[str, float] | None) -> float | None:
    return (trial or {}).get("GPU")


def _size_for(
    n_workers: int | None, trial: Mapping[str, float] | None, grow: bool = False
) -> EmbeddedSize:
    """The embedded cluster for trials needing ``trial`` (Dask's names) on this machine
    (``grow``: trials whose resources change, :func:`embedded_size`)."""
    return embedded_size(
        default_workers(), _cpu(trial), n_workers, gpus_available(), _gpu(trial), grow
    )


def cluster_totals(client: Client, embedded: bool) -> dict[str, float]:
    """The resources the trials share in all: the embedded cluster's cores and GPUs
    (each of its workers offers them all when trials grow), else what the workers
    offer, summed."""
    if embedded:
        gpus = gpus_available()
        return {"CPU": float(default_workers()), **({"GPU": float(gpus)} if gpus else {})}
    totals: dict[str, float] = {}
    for w in cluster_workers(client).values():
        for name, amount in w.get("resources", {}).items():
            totals[name] = totals.get(name, 0.0) + float(amount)
    return totals


def largest_worker(client: Client, embedded: bool) -> dict[str, float]:
    """What the biggest worker offers, resource by resource: the most one trial (one slot
    on one worker) can hold. The embedded cluster's workers each offer it all."""
    if embedded:
        return cluster_totals(client, embedded)
    largest: dict[str, float] = {}
    for w in cluster_workers(client).values():
        for name, amount in w.get("resources", {}).items():
            largest[name] = max(largest.get(name, 0.0), float(amount))
    return largest


#: What a worker runs popflow's segments with (infra cannot import the worker layer).
RUNNER_MODULE = "popflow.tasks.runner"
#: preloaded too: a closing worker's heartbeat failure stays off the user's console
CLOSE_LOGS_MODULE = "popflow.infra.cluster.worker_close_logs"

#: Dask settings of the embedded cluster's workers. Dask's defaults sample every
#: thread's stack each 10 ms for the dashboard's Profile page and read the process's
#: memory each 100 ms: with one worker per core on a small machine, that took a share
#: of each worker's core, and segments waited for CPU. The Profile page still works at
#: 100 ms; a user's own cluster (``dask_address``) keeps its own settings.
EMBEDDED_WORKER_CONFIG = {
    "distributed.worker.profile.interval": "100ms",
    "distributed.worker.memory.monitor-interval": "1s",
    "distributed.admin.system-monitor.interval": "2s",
}


class _PinnedCluster(LocalCluster):
    """A LocalCluster whose worker ``i`` sees only ``devices[i]`` (dask-cuda's
    ``LocalCUDACluster`` pattern): its nanny sets ``CUDA_VISIBLE_DEVICES`` in the
    worker process, on every start and restart."""

    def __init__(self, devices: tuple[tuple[str, ...], ...], **kwargs: Any) -> None:
        self._devices = devices
        super().__init__(n_workers=0, **kwargs)
        self.scale(len(devices))

    def new_worker_spec(self) -> dict[Any, dict[str, Any]]:
        ((name, spec),) = super().new_worker_spec().items()
        spec = copy.deepcopy(spec)
        group = self._devices[int(name) % len(self._devices)]
        spec.setdefault("options", {}).setdefault("env", {})[CUDA_VISIBLE_DEVICES] = ",".join(group)
        return {name: spec}


def _local_cluster(size: EmbeddedSize) -> LocalCluster:
    """The embedded cluster: ``size.n_workers`` process workers with one thread each
    (one segment per process at a time), each declaring ``size.resources`` as Dask
    resources ``CPU`` and ``GPU`` (and pinned to ``size.devices``); they do not run the
    user's main script. Close it with :func:`_close_local_cluster`."""
    # the embedded scheduler lives in this process; its INFO chatter is not the user's business
    logging.getLogger("distributed").setLevel(logging.WARNING)
    # a dead worker is said once, by popflow's runner pool (the same filter: added once)
    logging.getLogger("distributed.scheduler").addFilter(DEAD_WORKER_BROADCAST)
    WITHOUT_MAIN.acquire()
    options: dict[str, Any] = {
        "threads_per_worker": 1,
        "processes": True,
        # a free port (never another cluster's 8787), on loopback like the scheduler
        "dashboard_address": "127.0.0.1:0",
        "resources": size.resources,
        "silence_logs": logging.WARNING,
        # the worker side of popflow imported as each worker starts, while the driver
        # opens the experiment, rather than by the first runner made on it
        "preload": [RUNNER_MODULE, CLOSE_LOGS_MODULE],
        "config": EMBEDDED_WORKER_CONFIG,
    }
    try:
        with _quiet_worker_start():
            if size.devices:
                cluster: LocalCluster = _PinnedCluster(size.devices, **options)
                cluster.wait_for_workers(size.n_workers)
                return cluster
            return LocalCluster(n_workers=size.n_workers, **options)
    except BaseException:
        WITHOUT_MAIN.release()
        raise


#: The Dask setting, read as each worker process imports Dask, that keeps its INFO lines
#: off the console: a worker that imports Prefect (the user's script does, and spawn
#: imports that script) printed ~20 of them each through Prefect's root handler
QUIET_WORKERS = "DASK_LOGGING__DISTRIBUTED"


@contextmanager
def _quiet_worker_start() -> Iterator[None]:
    """Within: worker processes started now import Dask with its INFO lines off (set in
    this process's environment only while they start; a user's own setting stands).
    A worker restarted later is quieted by its preload
    (:func:`~popflow.infra.cluster.worker_close_logs.quiet_distributed`)."""
    if os.environ.get(QUIET_WORKERS):
        yield
        return
    os.environ[QUIET_WORKERS] = "warning"
    try:
        yield
    finally:
        os.environ.pop(QUIET_WORKERS, None)


#: Seconds an idle embedded worker process gets to exit when the cluster closes before
#: its nanny kills it (0.8 of it; Dask's default is 4 s: on a loaded small machine the
#: exits overran it and each printed "Worker process still alive after 4.0 seconds,
#: killing" after a run that went well).
IDLE_WORKER_CLOSE_S = 30.0


def _close_local_cluster(cluster: LocalCluster) -> None:
    try:
        cluster.sync(_close_idle_workers, cluster)
        cluster.close()
    finally:
        WITHOUT_MAIN.release()


#: Seconds a worker still running a segment gets before its nanny kills it (0.8 of it):
#: nothing waits for that segment any more.
BUSY_WORKER_CLOSE_S = 1.0


async def _close_idle_workers(cluster: LocalCluster) -> None:
    """Close the workers, each given :data:`IDLE_WORKER_CLOSE_S` to exit, when none runs a
    task (a run that ended); a worker still running a segment (a run stopped by an error
    or Ctrl-C) is left to Dask's close, which kills it after 4 s rather than wait for it.
    A segment the driver gave up on (the budget's end came and it never reported) has
    left the scheduler's books but still runs in its worker: those are killed at once."""
    scheduler = cluster.scheduler  # in this process: its state read on its own loop
    if scheduler is None or any(ws.processing for ws in scheduler.workers.values()):
        return
    busy = await _executing(scheduler)
    nannies = list(cluster.workers.values())
    await asyncio.gather(
        *(
            n.close(
                timeout=BUSY_WORKER_CLOSE_S
                if busy.get(n.worker_address, True)
                else IDLE_WORKER_CLOSE_S
            )
            for n in nannies
        )
    )


async def _executing(scheduler: Any) -> dict[str, bool]:
    """Whether each worker still executes a task, by its own account (a cancelled task
    runs on until its function returns); a worker that does not answer counts as busy."""
    from distributed.protocol.pickle import dumps

    msg = {"op": "run", "function": dumps(_executes), "args": dumps(()), "kwargs": dumps({})}
    try:
        replies = await asyncio.wait_for(scheduler.broadcast(msg=msg), timeout=5.0)
    except Exception:  # any failure: count them busy, kill rather than wait
        return {}
    return {address: _said(reply) is not False for address, reply in replies.items()}


def _said(reply: Any) -> Any:
    """What a worker's ``run`` returned (the scheduler passes it on still serialized)."""
    from distributed.protocol import deserialize
    from distributed.protocol.serialize import Serialized

    if not isinstance(reply, dict) or reply.get("status") != "OK":
        return None
    result = reply.get("result")
    return deserialize(result.header, result.frames) if isinstance(result, Serialized) else result


def _executes(dask_worker: Any) -> bool:
    return bool(dask_worker.state.executing)


class ClusterStart:
    """The embedded LocalCluster, starting in a background thread.

    ``popflow.run`` starts it before it creates its Prefect flow run, so the workers'
    start-up overlaps the flow run's creation; the flow
    waits for it when it first needs the cluster. The starter closes it.
    """

    def __init__(
        self,
        n_workers: int | None = None,
        resources: Mapping[str, float] | None = None,
        grow: bool = False,
    ) -> None:
        """``resources``: what one trial holds, in Dask's names (``RunSpec.resources``);
        the workers are sized so that it fits one (:func:`embedded_size`)."""
        # the count now (it checks n_workers and names the cluster); the GPUs, which
        # take nvidia-smi to count, while Prefect creates the flow run
        gpus = gpus_available() if _gpu(resources) else 0  # else counted in the background
        self.n_workers = embedded_size(
            default_workers(), _cpu(resources), n_workers, gpus, _gpu(resources)
        ).n_workers
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="popflow-cluster-start")
        self._future = self._thread.submit(
            lambda: _local_cluster(_size_for(n_workers, resources, grow))
        )
        self._closed = False

    def cluster(self) -> LocalCluster:
        return self._future.result()

    def close(self) -> None:
        if self._closed:
            return  # closing twice must not release the main-script patch twice
        self._closed = True
        try:
            cluster = self._future.result()
        except Exception:
            return  # it never started; the flow has raised why
        finally:
            self._thread.shutdown()
        _close_local_cluster(cluster)

    def __repr__(self) -> str:
        return f"<embedded LocalCluster of {self.n_workers} workers>"


@contextmanager
def dask_client(
    address: str | Client | ClusterStart | None = None,
    n_workers: int | None = None,
    resources: Mapping[str, float] | None = None,
    grow: bool = False,
) -> Iterator[Client]:
    """Yield a client: to ``address`` if given, else to a new LocalCluster torn down on exit
    (see :func:`_local_cluster`; sized for trials holding ``resources``, one worker per
    core by default)."""
    if isinstance(address, Client):
        yield address
        return
    if isinstance(address, ClusterStart):
        with Client(address.cluster()) as client:
            yield client
        return
    if address:
        try:
            client = Client(address)
        except OSError as e:  # Dask's "Timed out trying to connect to ... after 30 s"
            raise SchedulerUnreachable(
                f"no Dask scheduler answers at {address} ({e}): start it, or give the "
                "address of one that runs"
            ) from None
        try:
            yield client
        finally:
            close_client(client)
        return
    cluster = _local_cluster(_size_for(n_workers, resources, grow))
    try:
        with Client(cluster) as client:
            yield client
    finally:
        _close_local_cluster(cluster)


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
    workers = cluster_workers(client)
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
