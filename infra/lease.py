"""One driver per experiment, by fencing: numbered leases created only if absent.

A driver takes the experiment by creating ``.popflow/lease/<epoch>.json``
for the next epoch with a create-if-absent write (local disk: a hard link,
which fails if the name exists; S3: a conditional PUT, ``If-None-Match: *``).
Of two drivers starting at the same instant exactly one creates it; the other
is refused. The holder renews its lease file from a background thread; a
driver may take over when the newest lease is released, expired, or held by
a process that is provably gone (same host: no such process, a zombie, or a
pid reused by another process).

Taking over never relies on the old driver noticing in time. Each commit
carries its writer's epoch and is itself created only if absent
(:mod:`popflow.infra.experiment_log`); before each round's writes the holder
checks that no newer lease exists (:meth:`Lease.check`). A driver that finds
a newer epoch, there or when renewing, raises :class:`LeaseLost` and writes
nothing more.

On a store without conditional writes the lease falls back to write, then
read back (two drivers starting within the same instant could both go on);
popflow says so in a warning.
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

LEASE_DIR = ".popflow/lease"
#: Lease files older than the newest by more than this are removed.
_KEEP_EPOCHS = 2


class LeaseHeldError(RuntimeError):
    """Another live driver owns the experiment."""


class LeaseLost(RuntimeError):
    """A newer driver took the experiment over; this one must write nothing more."""


def lease_path(epoch: int) -> str:
    return f"{LEASE_DIR}/{epoch:08d}.json"


def fence(storage: Storage, epoch: int) -> None:
    """Raise :class:`LeaseLost` if a driver newer than ``epoch`` holds the experiment
    (workers call it before publishing a checkpoint for the driver of ``epoch``)."""
    if epoch and storage.file_exists(lease_path(epoch + 1)):
        raise LeaseLost(
            f"driver epoch {epoch + 1} took {storage.url} over; a segment of driver epoch "
            f"{epoch} publishes nothing more"
        )


def lease_holder(storage: Storage) -> dict[str, Any] | None:
    """The newest lease of the experiment at ``storage`` while it is held (not released
    nor expired); None when no driver holds it."""
    lease = Lease(storage)
    epochs = lease._epochs()
    current = lease._read(epochs[-1]) if epochs else None
    return None if not current or _lapsed(current) else current


def live_holder(storage: Storage) -> dict[str, Any] | None:
    """:func:`lease_holder`, and only while its driver lives: on this host a holder whose
    process is gone holds nothing (the rule a driver taking over applies)."""
    holder = lease_holder(storage)
    return None if holder is None or Lease(storage).is_gone(holder) else holder


def _lapsed(lease: dict[str, Any]) -> bool:
    """Released by its holder, or past its expiry."""
    return bool(lease.get("released")) or lease.get("expires", 0) < time.time()


def _process_start(pid: int) -> str | None:
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


class Lease:
    """The experiment's lease, for this driver: ``with Lease(storage, ttl_s): ...``."""

    def __init__(self, storage: Storage, ttl_s: float = 60.0) -> None:
        if not ttl_s > 0:
            raise ValueError(f"`lease_ttl` is {ttl_s!r}, but must be > 0")
        self.storage = storage
        self.ttl_s = ttl_s
        pid = os.getpid()
        self.owner = {
            "host": socket.gethostname(),
            "pid": pid,
            "start": _process_start(pid),
            "id": uuid.uuid4().hex,
        }
        self.epoch = 0
        self._lost: str | None = None  # why, once a newer driver is seen
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading -------------------------------------------------------------
    def _epochs(self) -> list[int]:
        names = self.storage.listdir(LEASE_DIR)
        return sorted(int(n[:8]) for n in names if n.endswith(".json") and n[:8].isdigit())

    def _read(self, epoch: int) -> dict[str, Any] | None:
        try:
            return json.loads(self.storage.read_bytes(lease_path(epoch)))
        except FileNotFoundError:
            return None
        except ValueError:
            return {}  # a torn lease file is an expired lease

    def is_gone(self, lease: dict[str, Any]) -> bool:
        """Whether ``lease``'s holder no longer holds it."""
        if _lapsed(lease):
            return True
        if lease.get("host") != self.owner["host"]:
            return False  # another machine's process: only its expiry tells
        start = _process_start(int(lease.get("pid", -1)))
        return start is None or (lease.get("start") not in (None, start))

    def _body(self, **extra: Any) -> str:
        return json.dumps(
            {**self.owner, "epoch": self.epoch, "expires": time.time() + self.ttl_s, **extra}
        )

    # -- taking and keeping --------------------------------------------------
    def acquire(self) -> None:
        epochs = self._epochs()
        newest = epochs[-1] if epochs else 0
        current = self._read(newest) if newest else None
        if current is not None and not self.is_gone(current):
            raise LeaseHeldError(
                f"experiment at {self.storage.url} is being run by pid {current.get('pid')} on "
                f"{current.get('host')} (lease valid for another "
                f"{current.get('expires', 0) - time.time():.0f} s); two drivers must never write "
                "one experiment"
            )
        self.epoch = newest + 1
        if not self.storage.create_text(self._body(), lease_path(self.epoch)):
            raise LeaseHeldError(
                f"another driver took the lease of {self.storage.url} at the same time "
                f"(epoch {self.epoch})"
            )
        for old in epochs[: max(0, len(epochs) - _KEEP_EPOCHS + 1)]:
            self.storage.remove_file(lease_path(old))
        self._thread = threading.Thread(target=self._renew, name="popflow-lease", daemon=True)
        self._thread.start()

    def check(self, fresh: bool = True) -> None:
        """Raise :class:`LeaseLost` if a newer driver has taken the experiment over.

        ``fresh``: look in storage (one request); else only at what the renewal
        thread last saw.
        """
        if fresh and self._lost is None and self.storage.exists(lease_path(self.epoch + 1)):
            self._lost = f"driver epoch {self.epoch + 1} took the experiment over"
        if self._lost is not None:
            raise LeaseLost(
                f"this driver (epoch {self.epoch}) lost the lease of {self.storage.url}: "
                f"{self._lost}; it stops and writes nothing more"
            )

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                if self.storage.exists(lease_path(self.epoch + 1)):
                    self._lost = f"driver epoch {self.epoch + 1} took the experiment over"
                    logger.error("experiment at %s: %s", self.storage.url, self._lost)
                    return
                self.storage.write_text(self._body(), lease_path(self.epoch))
            except Exception:  # keep trying; the lease only lapses after ttl
                logger.exception("renewing the experiment lease failed")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.epoch and self._lost is None:
            try:
                if not self.storage.exists(lease_path(self.epoch + 1)):
                    self.storage.write_text(self._body(released=True), lease_path(self.epoch))
            except Exception:  # it expires by itself
                logger.exception("releasing the experiment lease failed")

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
