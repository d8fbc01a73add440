"""A lease file as a reader sees it: read it safely, judge it, tell who holds it.

A lease file is data from storage that anyone with write access could have planted: it
is read without following links or blocking, at most :data:`MAX_LEASE_BYTES`, and a file
that is not JSON, names no finite expiry, or was modified in the future counts as lapsed
(a warning names it). Whatever expiry it claims, a lease lapses at most
:data:`EXPIRY_CAP_TTLS` of the reader's ttls after its file was last written, by the
storage's clock (:mod:`popflow.infra.store.lease` takes and keeps leases).
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
from typing import Any

from popflow.infra.storage import local_files
from popflow.infra.storage.errors import StorageError
from popflow.infra.storage.folder import Storage
from popflow.infra.storage.safe_paths import UnsafePath
from popflow.infra.store.layout import lease_path

logger = logging.getLogger(__name__)

#: A lease lapses at most this many of the reader's ttls after its file was last written
#: (see above).
EXPIRY_CAP_TTLS = 2.0
#: The most bytes read from a lease file (popflow writes ~200): a larger one has lapsed.
MAX_LEASE_BYTES = 64 << 10
#: How far a lease file's modification time may be ahead of the reader's clock (clock skew
#: between a client and its object store) before it is not trusted (see above).
FUTURE_TOLERANCE_S = 60.0


def read_lease(storage: Storage, epoch: int, ttl_s: float, now: float) -> dict[str, Any] | None:
    """Lease ``epoch`` as stored, its expiry capped by the reader's ``ttl_s`` (``now``: the
    reader's clock); {} for a torn or garbled file (an expired lease), None if there is
    none."""
    path = lease_path(epoch)
    try:
        data = _read_capped(storage, path)
        written = storage.modified(path) if data is not None else 0.0
    except FileNotFoundError:
        return None
    except UnsafePath:  # a link out of the experiment
        data = None
    except StorageError as e:
        if e.errno not in (errno.EISDIR, errno.ELOOP):
            raise  # a failing store is no lapsed lease
        data = None
    if data is None:
        logger.warning(
            "lease file %s is garbled: it counts as lapsed (no regular file: a link, a "
            "FIFO, a folder)",
            path,
        )
        return {}
    if len(data) > MAX_LEASE_BYTES:
        logger.warning(
            "lease file %s is garbled: it counts as lapsed (larger than %d bytes; no more is read)",
            path,
            MAX_LEASE_BYTES,
        )
        return {}
    try:
        lease = json.loads(data)
    except (ValueError, RecursionError):  # not JSON; nested past the parser's limit
        logger.warning("lease file %s is garbled: it counts as lapsed", path)
        return {}
    if not isinstance(lease, dict):
        logger.warning("lease file %s is garbled: it counts as lapsed", path)
        return {}
    # the file's own "ttl" is not trusted: a forged 1e300 would hold the lease forever
    expires = number(lease.get("expires"), math.nan)
    if math.isnan(expires):
        logger.warning(
            "lease file %s has no expiry that is a finite number: it counts as lapsed", path
        )
        expires = 0.0
    if written > now + FUTURE_TOLERANCE_S:
        # whoever can write the folder sets a local file's mtime: from the future, the
        # cap below would hold the lease until then
        logger.warning(
            "lease file %s was modified %.0f s in the future (by this machine's clock): "
            "not trusted, it counts as lapsed",
            path,
            written - now,
        )
        expires = 0.0
    lease["expires"] = min(expires, written + EXPIRY_CAP_TTLS * ttl_s)
    return lease


def _read_capped(storage: Storage, path: str) -> bytes | None:
    """At most :data:`MAX_LEASE_BYTES` + 1 bytes of the lease file ``path``, or None if it
    is no regular file (local disk: a link, a FIFO, a folder). Through the storage's one
    call helper, so retries and simulated faults apply as to any read."""
    p = storage.path(path)
    if storage.is_local:
        return storage._call("read", p, lambda: local_files.read_regular_file(p, MAX_LEASE_BYTES))
    # an object is always a regular file; a ranged GET caps what is read
    return storage._call(
        "read", p, lambda: storage.fs.cat_file(p, start=0, end=MAX_LEASE_BYTES + 1)
    )


def number(value: Any, default: float) -> float:
    """``value`` as a finite float (a lease file is data from storage: anything may be
    in it), else ``default``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return default
    return float(value)


def shown(value: Any) -> str:
    """A value from a lease file, fit for a message: short and printable."""
    text = str(value)
    return text if len(text) <= 64 and text.isprintable() else repr(text[:64])


def process_start(pid: int) -> str | None:
    """When ``pid`` started (clock ticks since boot), or None if there is no such live
    process; a zombie (killed, not yet reaped) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None if os.path.isdir("/proc") else _alive_without_proc(pid)
    fields = stat.rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
    state, start = fields[0], fields[19]
    return None if state in ("Z", "X") else start


def _alive_without_proc(pid: int) -> str | None:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return "?"
