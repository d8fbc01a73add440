"""The driver's link to a Dask scheduler of the user's (``dask_address``): the workers it
has, and what a lost or absent scheduler looks like to a run (one line, not Dask's trace)."""

from __future__ import annotations

import logging
from typing import Any

from distributed import Client


class SchedulerLost(RuntimeError):
    """The Dask scheduler went away (its process ended, its host is unreachable): the
    client cannot reach it, and its workers close with it."""


class SchedulerUnreachable(RuntimeError):
    """No Dask scheduler answers at the address a run was given."""


def scheduler_address(client: Client) -> str:
    """The address of ``client``'s scheduler, as the user gave it."""
    return str(getattr(client.scheduler, "address", None) or client.scheduler_file or "?")


def cluster_workers(client: Client) -> dict[str, Any]:
    """The scheduler's workers, by address (one look at the scheduler); raises
    :class:`SchedulerLost` when the client is not connected to it. A client whose
    scheduler went away answers from its cache, or nothing at all."""
    address = scheduler_address(client)
    if client.status == "running":
        info = client.scheduler_info(n_workers=-1)
        if client.status == "running" and "workers" in info:
            return dict(info["workers"])
    raise SchedulerLost(f"the Dask scheduler at {address} went away")


def close_client(client: Client) -> None:
    """Close a client of the user's scheduler. One that lost its scheduler is reconnecting:
    closing it cancels that, which Dask logs as an ERROR with a trace; the run has said
    what happened in one line (:class:`SchedulerLost`)."""
    if client.status == "running":
        client.close()
        return
    dask_client_log = logging.getLogger("distributed.client")
    level = dask_client_log.level
    dask_client_log.setLevel(logging.CRITICAL)
    try:
        client.close()
    finally:
        dask_client_log.setLevel(level)
