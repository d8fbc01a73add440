"""One driver per experiment: a lease object with an owner and an expiry, kept in storage.

The driver that runs an experiment holds ``.popflow/lease.json`` and renews it
from a background thread. Another driver refuses to start while the lease is
live; an expired lease (its driver died) is taken over. On the same host, a
lease whose owner process no longer exists is taken over at once, so a resume
right after a crash does not wait for the expiry.

Object stores give no compare-and-swap through fsspec, so two drivers starting
within the same instant could both write; each re-reads the lease after
writing and only the one that finds itself the owner goes on.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from popflow.infra.storage import Storage

logger = logging.getLogger(__name__)

LEASE_FILE = ".popflow/lease.json"


class LeaseHeldError(RuntimeError):
    """Another live driver owns the experiment."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Lease:
    def __init__(self, storage: Storage, ttl_s: float = 60.0) -> None:
        if ttl_s <= 0:
            raise ValueError(f"`lease_ttl` is {ttl_s}, but must be > 0")
        self.storage = storage
        self.ttl_s = ttl_s
        self.owner = {"host": socket.gethostname(), "pid": os.getpid(), "id": uuid.uuid4().hex}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.storage.read_bytes(LEASE_FILE))
        except FileNotFoundError:
            return None
        except ValueError:
            return None  # a torn lease is no lease

    def _write(self) -> None:
        body = {**self.owner, "expires": time.time() + self.ttl_s}
        self.storage.write_text(json.dumps(body), LEASE_FILE)

    def _stale(self, lease: dict[str, Any]) -> bool:
        if lease.get("expires", 0) < time.time():
            return True
        same_host = lease.get("host") == self.owner["host"]
        return same_host and not _pid_alive(int(lease.get("pid", -1)))

    def acquire(self) -> None:
        current = self._read()
        if (
            current is not None
            and current.get("id") != self.owner["id"]
            and not self._stale(current)
        ):
            raise LeaseHeldError(
                f"experiment at {self.storage.url} is being run by pid {current.get('pid')} on "
                f"{current.get('host')} (lease valid for another "
                f"{current['expires'] - time.time():.0f} s); two drivers must never write one "
                "experiment"
            )
        self._write()
        if (self._read() or {}).get("id") != self.owner["id"]:
            raise LeaseHeldError(
                f"another driver took the lease of {self.storage.url} at the same time"
            )
        self._thread = threading.Thread(target=self._renew, name="popflow-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self._write()
            except Exception:  # keep trying; the lease only lapses after ttl
                logger.exception("renewing the experiment lease failed")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if (self._read() or {}).get("id") == self.owner["id"]:
            self.storage.remove(LEASE_FILE)

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
