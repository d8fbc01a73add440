"""A worker's side of the storage probe: does this worker see the storage the driver writes?

The driver writes a fresh token to :data:`~popflow.infra.store.layout.STORAGE_PROBE_FILE`
and asks each Dask worker, before it trains, to read it back
(:mod:`popflow.flows.backends.storage_probe`). A worker on another machine given a local
folder reads its own machine's folder at that path: no token, or an older run's.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

from popflow.infra.storage.folder import Storage
from popflow.infra.store.layout import STORAGE_PROBE_FILE


def read_probe(storage: Storage, token: str) -> str | None:
    """None if this worker reads ``token`` in ``storage``'s probe file; else what it
    found instead, in words (naming this worker's host)."""
    where = f"on host {socket.gethostname()}"
    try:
        text = storage.read_text(STORAGE_PROBE_FILE)
    except FileNotFoundError:
        return f"{storage.full_url(STORAGE_PROBE_FILE)} does not exist {where}"
    except Exception as exc:  # credentials missing there, its endpoint unreachable, ...
        return f"reading {storage.full_url(STORAGE_PROBE_FILE)} {where} failed: {exc}"
    try:
        found = json.loads(text).get("token")
    except (ValueError, AttributeError):
        found = None
    if found != token:
        return (
            f"{storage.full_url(STORAGE_PROBE_FILE)} {where} holds another token than the "
            "driver wrote (an earlier run's, on that host's own disk)"
        )
    return None


async def probe_on_worker(
    storage: Storage, token: str, timeout_s: float, dask_worker: Any = None
) -> str | None:
    """:func:`read_probe` on a worker, run by ``Client.run`` on its event loop: the read
    goes to a thread of its own, so a worker whose task threads are all busy (another
    run's segments, a colleague's job) answers all the same, and a read that hangs (a
    hung mount) is given up after ``timeout_s`` without blocking the worker's loop."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(read_probe, storage, token), timeout_s)
    except TimeoutError:
        return f"reading it did not end within {timeout_s:.0f} s there (a hung mount?)"
