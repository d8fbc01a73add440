"""A worker's side of the storage probe: does this worker see the storage the driver writes?

The driver writes a fresh token to :data:`~popflow.infra.store.layout.STORAGE_PROBE_FILE`
and asks each Dask worker, before it trains, to read it back
(:mod:`popflow.flows.backends.storage_probe`). A worker on another machine given a local
folder reads its own machine's folder at that path: no token, or an older run's.
"""

from __future__ import annotations

import json
import socket

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
