"""A runner's slot made again to hold other resources: a ResourceChangingScheduler's trial
grew or shrank (:meth:`popflow.flows.backends.dask_pool.RunnerPool.resize`).

The idle runner is closed and its hold cancelled, a new runner actor is made on the same
worker, and its ``hold_slot`` task asks Dask for the trial's resources: Dask then counts
what the trial holds now. The worker's parked trainables stay in its process.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

from distributed import Client, Future

from popflow.flows.backends.runners import Runner
from popflow.infra.cluster.scheduler_link import cluster_workers
from popflow.tasks.runner import SegmentRunner, hold_slot

if TYPE_CHECKING:
    from popflow.flows.backends.dask_pool import RunnerPool

logger = logging.getLogger(__name__)

#: Seconds between looks at whether the worker of a runner being made is still there.
LOOK_S = 2.0


def resize(
    pool: RunnerPool, runner: Runner, resources: Mapping[str, float] | None
) -> Runner | None:
    """``runner``'s slot (idle) given back and one holding ``resources`` made on its worker
    instead, in ``pool``; None: its worker left meanwhile (the call waits for another)."""
    client = pool.client
    pool.runners.remove(runner)
    worker = runner.worker
    with contextlib.suppress(RuntimeError):  # its worker was lost meanwhile
        runner.actor.close()  # a hold running returns
    # a hold not started yet never will (closing alone would miss it: it would make its
    # queue anew and hold the worker's one thread for ever); the new actor waits for
    # that thread
    client.cancel([runner.hold, runner.future])
    token = uuid.uuid4().hex
    gpu = (resources or {}).get("GPU", 0.0)
    actor = client.submit(
        SegmentRunner, worker, token, 0, gpu, actor=True, workers=[worker], pure=False
    )
    if not settles(client, actor, worker):
        client.cancel([actor])
        return None
    hold = client.submit(
        hold_slot,
        token,
        key=f"popflow-{pool.label}-slot-{token}",
        workers=[worker],
        allow_other_workers=False,
        resources=dict(resources) if resources else None,
        pure=False,
    )
    new = Runner(worker, actor.result(), actor, hold, resources=dict(resources or {}) or None)
    pool.runners.append(new)
    logger.debug("slot on %s resized to %s", worker, resources)
    return new


def settles(client: Client, future: Future, worker: str) -> bool:
    """Wait until ``future`` is done (True), or its worker has left (False), looked at
    every ``LOOK_S`` (a timed-out ``result()`` can raise Dask's own UnboundLocalError,
    so its state is polled instead)."""
    look = time.monotonic() + LOOK_S
    while not future.done():
        if time.monotonic() > look:
            if worker not in cluster_workers(client):
                return False
            look = time.monotonic() + LOOK_S
        time.sleep(0.01)  # the client's loop delivers the state; nothing to wake on here
    return True
