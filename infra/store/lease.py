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
(:mod:`popflow.infra.store.commit_log`); before each round's writes the holder
checks that no newer lease exists (:meth:`Lease.check`). A driver that finds
a newer epoch, there or when renewing, raises :class:`LeaseLost` and writes
nothing more.

"Newer" means any lease file numbered above one's own, not only the next one:
a driver taking over deletes all but the two newest lease files, so after
several takeovers a stalled driver's successor ``<epoch+1>`` may be gone while
``<epoch+3>`` holds. The newest lease file is never deleted (pruning keeps the
one it just created and the one before), so a listing of the lease folder
always shows the newest epoch, on local disk and on S3 (strongly consistent
listings). A driver that wins the create of an epoch that pruning had already
removed (it listed, stalled, then created) sees the newer one in the listing
it takes right after, and gives its lease back unused.

A lease's expiry is capped when read: it lapses at most ``2 * ttl_s`` after the
lease file was last written, by the storage's clock (its modification time),
where ``ttl_s`` is the *reader's* (the ``lease_ttl`` of the driver that would
take over), whatever the file says its ttl or expiry is; so a holder whose clock
runs ahead, or a lease file forged with an expiry far in the future, holds the
experiment for minutes, not forever. A lease file that is not JSON, or whose
expiry is missing, not a number or not finite, has lapsed. So has a lease file that is no
regular file (a link, a FIFO, a folder: it is opened without following links and without
blocking), one larger than :data:`MAX_LEASE_BYTES` (no more is read), and one whose
modification time is more than :data:`FUTURE_TOLERANCE_S` ahead of the reader's clock: a
writer sets a local file's mtime (``touch -d 2035``), so a future one is not trusted, and
a lease whose mtime is within that tolerance lapses at most ``FUTURE_TOLERANCE_S + 2 *
ttl_s`` after the reader first saw it. Each warns, naming the file.
``popflow resume --force-takeover`` takes over a lease that still looks held.

Epochs are numbers (``100000000.json`` is newer than ``99999999.json``); names that
:func:`~popflow.infra.store.layout.lease_path` cannot have made, an absurd epoch
beyond :data:`~popflow.infra.store.layout.MAX_NUMBER` among them, are skipped by
every reader (a warning names them). A planted epoch is counted like any other (the next
driver takes the one after it) up to ``MAX_NUMBER``, where no epoch is left to take. No run
gets near it: epochs from :data:`IMPLAUSIBLE_EPOCH` (10**12, a takeover a second for
30,000 years) on were planted or taken after one that was. So when the newest lease is
at ``MAX_NUMBER`` and has lapsed (or ``force``), the driver taking over removes every
lease file from ``IMPLAUSIBLE_EPOCH`` on (a warning names them) and takes the first epoch
above the newest left that is none of those it removed: no planted file locks the
experiment. A driver whose own lease file is gone has lost the lease (while it is the
newest, nothing else removes it), so the holder of a removed epoch stops at its next look.

On a store without conditional writes the lease falls back to write, then
read back (two drivers starting within the same instant could both go on);
popflow says so in a warning.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from popflow.infra.storage.errors import StorageError
from popflow.infra.storage.folder import Storage
from popflow.infra.store.layout import (
    LEASE_DIR,
    MAX_NUMBER,
    lease_epochs_in,
    lease_path,
    stray_numbered_names,
)
from popflow.infra.store.lease_files import number, process_start, read_lease, shown
from popflow.infra.store.lease_proof import LeaseProof

logger = logging.getLogger(__name__)

#: Lease files older than the newest by more than this are removed.
_KEEP_EPOCHS = 2
#: :meth:`Lease.guard` looks in storage at most this often. A look is a listing, and one
#: per file written lists the folder once for each of a large round's hundreds of files; a
#: driver taken over had stalled past its lease, far longer than this.
LOOK_EVERY_S = 0.05
#: Lease epochs from here on are planted, or taken right after a planted one (see above).
IMPLAUSIBLE_EPOCH = 10**12


class LeaseHeldError(RuntimeError):
    """Another live driver owns the experiment."""


class LeaseLost(RuntimeError):
    """A newer driver took the experiment over; this one must write nothing more."""


#: The lease's errors: no bug to trace, each one's line says what happened and what to do
#: (callers show them without their traceback)
LEASE_ERRORS = (LeaseHeldError, LeaseLost)


def lease_epochs(storage: Storage) -> list[int]:
    """The epochs of the lease files in ``storage``'s experiment, oldest first (one
    listing: one request on an object store)."""
    return lease_epochs_in(storage.listdir(LEASE_DIR))


def newer_epoch(storage: Storage, epoch: int) -> int | None:
    """The newest epoch above ``epoch`` that holds a lease file, or None: whether any
    driver took the experiment over from the driver of ``epoch``, however many
    takeovers ago (pruning may have removed ``epoch + 1``)."""
    newest = max(lease_epochs(storage), default=0)
    return newest if newest > epoch else None


def fence(storage: Storage, epoch: int) -> None:
    """Raise :class:`LeaseLost` if a driver newer than ``epoch`` holds the experiment
    (workers call it before publishing a checkpoint for the driver of ``epoch``)."""
    newer = newer_epoch(storage, epoch) if epoch else None
    if newer is not None:
        raise LeaseLost(
            f"driver epoch {newer} took {storage.url} over; a segment of driver epoch "
            f"{epoch} publishes nothing more"
        )


def lease_holder(storage: Storage) -> dict[str, Any] | None:
    """The newest lease of the experiment at ``storage`` while it is held (not released
    nor expired); None when no driver holds it."""
    lease = Lease(storage)
    epochs = lease_epochs(storage)
    current = lease._read(epochs[-1]) if epochs else None
    return None if not current or lease.lapsed(current) else current


def live_holder(storage: Storage) -> dict[str, Any] | None:
    """:func:`lease_holder`, and only while its driver lives: on this host a holder whose
    process is gone holds nothing (the rule a driver taking over applies)."""
    holder = lease_holder(storage)
    return None if holder is None or Lease(storage).is_gone(holder) else holder


def break_lease(storage: Storage) -> dict[str, Any] | None:
    """Take the experiment from whoever holds its lease, alive or not, and give it back
    at once (``popflow resume --force-takeover``, for a holder known to be gone whose
    lease still looks held: a forged lease, a clock far ahead). The holder, if it still
    runs, is fenced off: it stops at its next write with :class:`LeaseLost`, and the
    round it was in runs again in the next driver. Returns the lease it broke (None if
    nobody held it)."""
    held = lease_holder(storage)
    lease = Lease(storage, force=True)
    lease.acquire(renew=False)
    lease.release()
    return held


class Lease:
    """The experiment's lease, for this driver: ``with Lease(storage, ttl_s): ...``."""

    def __init__(
        self,
        storage: Storage,
        ttl_s: float = 60.0,
        clock: Callable[[], float] = time.time,
        force: bool = False,
    ) -> None:
        """``clock``: wall-clock seconds (the expiries written and compared; tests pass
        their own). ``force``: take the experiment even from a holder that looks alive
        (``popflow resume --force-takeover``): fencing stops that driver at its next
        write, and the round it was in runs again here."""
        if not ttl_s > 0 or not math.isfinite(ttl_s):
            raise ValueError(f"`lease_ttl` is {ttl_s!r}, but must be a finite number > 0")
        self.storage = storage
        self.ttl_s = ttl_s
        self.clock = clock
        self.force = force
        pid = os.getpid()
        self.owner = {
            "host": socket.gethostname(),
            "pid": pid,
            "start": process_start(pid),
            "id": uuid.uuid4().hex,
        }
        self.epoch = 0
        self._lost: str | None = None  # why, once a newer driver is seen
        self.proof = LeaseProof(ttl_s, clock)  # whether storage still shows it holds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading -------------------------------------------------------------
    def _read(self, epoch: int) -> dict[str, Any] | None:
        """Lease ``epoch`` as stored, its expiry capped by this reader's ttl
        (:func:`~popflow.infra.store.lease_files.read_lease`)."""
        return read_lease(self.storage, epoch, self.ttl_s, self.clock())

    def lapsed(self, lease: dict[str, Any]) -> bool:
        """Released by its holder, or past its (capped) expiry."""
        return bool(lease.get("released")) or number(lease.get("expires"), 0.0) < self.clock()

    def is_gone(self, lease: dict[str, Any]) -> bool:
        """Whether ``lease``'s holder no longer holds it."""
        if self.lapsed(lease):
            return True
        if lease.get("host") != self.owner["host"]:
            return False  # another machine's process: only its expiry tells
        pid = lease.get("pid")
        # os.kill overflows past a C int: a forged pid is no process
        start = process_start(pid) if isinstance(pid, int) and 0 < pid < 2**31 else None
        return start is None or (lease.get("start") not in (None, start))

    def _body(self, **extra: Any) -> str:
        return json.dumps(
            {
                **self.owner,
                "epoch": self.epoch,
                "ttl": self.ttl_s,
                "expires": self.clock() + self.ttl_s,
                **extra,
            }
        )

    # -- taking and keeping --------------------------------------------------
    def acquire(self, renew: bool = True) -> None:
        """Take the experiment under the next epoch, or raise :class:`LeaseHeldError`.

        ``renew``: keep the lease alive from a background thread (else the caller
        calls :meth:`renew_once`, as the fencing tests do).
        """
        self.take(self.plan(), renew)

    def plan(self) -> int:
        """The epoch to take (the newest lease's, plus one), or :class:`LeaseHeldError`
        while its holder still holds it. The first half of :meth:`acquire`."""
        names = self.storage.listdir(LEASE_DIR)
        if strays := stray_numbered_names(names):
            logger.warning(
                "%s: skipping %s in %s: no lease files popflow writes (epochs are numbered "
                "00000001.json on, at most %d); remove them",
                self.storage.url,
                ", ".join(shown(n) for n in strays),
                LEASE_DIR,
                MAX_NUMBER,
            )
        epochs = lease_epochs_in(names)
        newest = max(epochs, default=0)
        current = self._read(newest) if newest else None
        after = newest  # the epoch taken is the first above this
        if newest >= MAX_NUMBER and (self.force or self.is_gone(current or {})):
            # no epoch is left above a planted one: start again below the planted range
            planted = [e for e in epochs if e >= IMPLAUSIBLE_EPOCH]
            logger.warning(
                "%s: removing %s in %s: no run makes %d takeovers, so these lease files were "
                "planted there or taken after one that was (see who else can write there)",
                self.storage.url,
                ", ".join(lease_path(e).rsplit("/", 1)[1] for e in planted),
                LEASE_DIR,
                IMPLAUSIBLE_EPOCH,
            )
            for e in planted:
                self.storage.remove_file(lease_path(e))
            newest = max((e for e in epochs if e < IMPLAUSIBLE_EPOCH), default=0)
            current = self._read(newest) if newest else None
            after = newest
            while after + 1 in planted:  # a stalled holder of a removed epoch is not this one
                after += 1
        if current is not None and not self.is_gone(current):
            if not self.force:
                left = number(current.get("expires"), 0.0) - self.clock()
                # a way on whether or not that driver committed a round yet (`popflow
                # resume` needs one: it exited 2 before the first)
                raise LeaseHeldError(
                    f"experiment at {self.storage.url} is being run by pid "
                    f"{shown(current.get('pid'))} on {shown(current.get('host'))} (lease "
                    f"valid for another {left:.0f} s); two drivers must never write one "
                    f"experiment. If that driver is gone: run again after {left:.0f} s, or "
                    f"now `popflow resume --force-takeover {self.storage.url}` once it "
                    "committed a round"
                )
            logger.warning(
                "taking %s over from pid %s on %s, whose lease looks held (--force-takeover): "
                "that driver stops at its next write",
                self.storage.url,
                shown(current.get("pid")),
                shown(current.get("host")),
            )
        return after + 1

    def take(self, epoch: int, renew: bool = True) -> None:
        """Create lease ``epoch`` (:meth:`plan`'s), or :class:`LeaseHeldError` if another
        driver created it or a newer one first; then delete all but the two newest (and
        the newest below the planted range)."""
        self.epoch = epoch
        self.proof.taken()
        if not self.storage.create_text(self._body(), lease_path(self.epoch)):
            raise LeaseHeldError(
                f"another driver took the lease of {self.storage.url} at the same time "
                f"(epoch {self.epoch})"
            )
        epochs = lease_epochs(self.storage)
        newest = max(epochs, default=self.epoch)
        if newest > self.epoch:  # this epoch had been pruned: a newer driver holds it
            self.storage.remove_file(lease_path(self.epoch))
            raise LeaseHeldError(
                f"driver epoch {newest} took the lease of {self.storage.url} while this "
                f"one was taking epoch {self.epoch}"
            )
        # the newest epoch below the planted range is kept too: after a planted lease is
        # cleared, the next epoch is taken above it, never one a stalled driver may hold
        plausible = [e for e in epochs if e < IMPLAUSIBLE_EPOCH]
        keep = set(epochs[-_KEEP_EPOCHS:]) | set(plausible[-1:])
        for old in epochs:
            if old not in keep:
                self.storage.remove_file(lease_path(old))
        if renew:
            self._thread = threading.Thread(target=self._renew, name="popflow-lease", daemon=True)
            self._thread.start()

    def _look(self) -> None:
        """Note a newer driver, or this driver's own lease file gone, if storage shows
        either (one listing). A listing that fails for good (storage unreachable past
        its retries) is :meth:`outage`'s to judge."""
        if self._lost is not None:
            return
        try:
            epochs = lease_epochs(self.storage)
        except StorageError as error:
            self._failed(error)
            raise
        newest = max(epochs, default=0)
        if newest > self.epoch:
            self._lost = f"driver epoch {newest} took the experiment over"
        elif self.epoch not in epochs:  # removed as planted (see the module's doc)
            self._lost = f"its lease file {lease_path(self.epoch)} was removed"

    def lost(self) -> LeaseLost | None:
        """:class:`LeaseLost` once this driver has seen it lost the lease (None: it holds)."""
        if self._lost is None:
            return None
        return LeaseLost(
            f"this driver (epoch {self.epoch}) lost the lease of {self.storage.url}: "
            f"{self._lost}; it stops and writes nothing more"
        )

    def answered_within(self, seconds: float) -> bool:
        """This driver renewed its lease within the last ``seconds`` and holds it."""
        return self._lost is None and self.proof.within(seconds)

    def _answered(self) -> None:
        why = self.proof.answered()
        if why is not None and self._lost is None:
            self._lost = why

    def _failed(self, error: StorageError) -> None:
        why = self.proof.failed(error)
        if why is not None and self._lost is None:
            self._lost = why

    def outage(self, error: BaseException) -> LeaseLost | None:
        """:class:`LeaseLost` if ``error`` is storage failing for good and this driver can
        no longer prove it holds the lease (storage has not shown it for a ttl: the lease
        may have lapsed and another driver taken over); None: ``error`` is the run's.
        A shorter outage is ridden out by the storage's retries (their deadline is the
        ttl, :func:`~popflow.infra.storage.retry.RetryPolicy.within`)."""
        if not isinstance(error, StorageError):
            return None
        self._failed(error)
        if self._lost is None:
            return None
        return LeaseLost(
            f"this driver (epoch {self.epoch}) lost the lease of {self.storage.url}: "
            f"{self._lost}; it stops and writes nothing more (`popflow resume "
            f"{self.storage.url}` goes on from the last commit)"
        )

    def check(self, fresh: bool = True) -> None:
        """Raise :class:`LeaseLost` if a newer driver has taken the experiment over.

        ``fresh``: look in storage (one request); else only at what the renewal
        thread last saw.
        """
        if fresh:
            self._look()
        lost = self.lost()
        if lost is not None:
            raise lost

    def guard(
        self, every_s: float = LOOK_EVERY_S, monotonic: Callable[[], float] = time.monotonic
    ) -> Callable[[], None]:
        """A check to call before each write (:class:`LeaseLost` once a newer driver
        holds the experiment): it looks in storage when ``every_s`` has passed since it
        last did, else at what it saw. A driver stopped for longer than that (SIGSTOP,
        a stall past its lease) looks again before its next write."""
        looked: list[float] = []

        def check() -> None:
            fresh = not looked or monotonic() - looked[0] >= every_s
            self.check(fresh=fresh)
            if fresh:
                looked[:] = [monotonic()]

        return check

    def renew_once(self) -> bool:
        """Extend the lease unless a newer driver took over; False once one has (the
        lease file is then left as it is)."""
        self._look()
        if self._lost is not None:
            return False
        try:
            self.storage.write_text(self._body(), lease_path(self.epoch))
        except StorageError as error:
            self._failed(error)
            raise
        self._answered()
        return self._lost is None

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                if not self.renew_once():
                    logger.error("experiment at %s: %s", self.storage.url, self._lost)
                    return
            except StorageError as e:  # keep trying: the driver stops once it is a ttl
                self._failed(e)
                logger.warning("renewing the lease of %s failed: %s", self.storage.url, e)
            except Exception:  # keep trying; the lease only lapses after ttl
                logger.exception("renewing the experiment lease failed")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.epoch and self._lost is None:
            try:
                self._look()
                if self._lost is None:
                    self.storage.write_text(self._body(released=True), lease_path(self.epoch))
            except Exception:  # it expires by itself
                logger.exception("releasing the experiment lease failed")

    def __enter__(self) -> Lease:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
