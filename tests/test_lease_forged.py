"""What a lease file says is data, not a promise: no lease file, however forged, garbled
or numbered, locks an experiment, and epochs are numbers at any digit count.

- A lease lapses at most 2 x the *reader's* ``lease_ttl`` after its file was written (by
  the storage's clock), whatever ttl or expiry the file claims.
- ``100000000.json`` (epoch 10**8, nine digits) is newer than ``99999999.json``: a garbled
  lease at 99999999 does not lock out the next driver or ``--force-takeover``, and no
  driver takes an epoch at or below one that exists.
- Names popflow cannot have written (an absurd epoch, padding it never writes) are
  skipped by every reader; a lease file at or just below the largest epoch is removed
  once it lapsed, and numbering starts again below the planted range.
- A lease file that is no regular file (a FIFO, a link), is larger than 64 KiB, or was
  modified in the future is garbled: it never hangs, fills memory nor holds the lease.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import types

import pytest

from popflow.infra.storage import local_files
from popflow.infra.storage.folder import Storage
from popflow.infra.store.layout import LEASE_DIR, MAX_NUMBER, lease_path
from popflow.infra.store.lease import (
    Lease,
    LeaseHeldError,
    LeaseLost,
    break_lease,
    fence,
    lease_epochs,
    lease_holder,
)
from popflow.infra.store.lease_files import FUTURE_TOLERANCE_S, MAX_LEASE_BYTES

NINE_DIGITS = 10**8  # the first epoch whose name has nine digits


class Clock:
    """A wall clock the test sets by hand (the lease compares expiries with it)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _elsewhere(storage: Storage, epoch: int | None = None) -> Lease:
    """A driver on another host holding the next lease, or ``epoch``'s (only its expiry
    says whether it is gone)."""
    lease = Lease(storage, ttl_s=60)
    lease.owner["host"] = "elsewhere"
    if epoch is None:
        lease.acquire(renew=False)
    else:
        lease.take(epoch, renew=False)
    return lease


# -- the cap: the reader's ttl, not the file's --------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    "claims",
    [
        {"ttl": 1e300, "expires": 1e300},  # the forgery
        {"ttl": 1e300, "expires": 4e9},
        {"ttl": 10**18, "expires": 10**18},
    ],
)
def test_a_forged_lease_lapses_two_of_the_readers_ttls_after_it_was_written(tmp_path, claims):
    check_forged_lease_lapses(Storage(str(tmp_path)), claims)


@pytest.mark.integration
def test_a_forged_lease_on_s3_lapses_two_of_the_readers_ttls_after_it_was_written(s3):
    check_forged_lease_lapses(s3, {"ttl": 1e300, "expires": 1e300})


def check_forged_lease_lapses(storage: Storage, claims: dict) -> None:
    """Held until 2 x 5 s after it was written (by the storage's clock), then lapsed."""
    forged = {"host": "elsewhere", "pid": 4242, "id": "x", "epoch": 1, **claims}
    storage.write_text(json.dumps(forged), lease_path(1))
    written = storage.modified(lease_path(1))
    clock = Clock(written + 1)
    with pytest.raises(LeaseHeldError, match="valid for another 9 s"):
        Lease(storage, ttl_s=5, clock=clock).acquire(renew=False)
    clock.now = written + 11  # 2 x 5 s after it was written: lapsed, whatever it claims
    assert Lease(storage, ttl_s=5, clock=clock).plan() == 2
    clock.now = written + 3600  # an hour old, as in the issue
    lease = Lease(storage, ttl_s=5, clock=clock)
    lease.acquire(renew=False)
    assert lease.epoch == 2


@pytest.mark.unit
@pytest.mark.parametrize(
    "body",
    [
        "[" * 100_000,  # valid JSON's start, nested past the parser's recursion limit
        '{"expires": ' + "[" * 100_000,
    ],
)
def test_a_lease_file_nested_too_deep_counts_as_garbled(tmp_path, body, caplog):
    storage = Storage(str(tmp_path))
    storage.write_text(body, lease_path(1))
    lease = Lease(storage, ttl_s=60)
    with caplog.at_level(logging.WARNING, logger="popflow.infra.store.lease"):
        lease.acquire(renew=False)
    assert lease.epoch == 2
    assert "lease/00000001.json is garbled: it counts as lapsed" in caplog.text


@pytest.mark.unit
@pytest.mark.parametrize(
    "body",
    [
        '{"pid": 4242, "host": "elsewhere", "expires": NaN}',
        '{"pid": 4242, "host": "elsewhere", "expires": Infinity, "ttl": Infinity}',
        '{"pid": 4242, "host": "elsewhere", "expires": "1e300"}',
        '{"pid": 4242, "host": "elsewhere", "ttl": 1e300}',
        '{"pid": 4242, "host": "elsewhere", "expires": true, "ttl": -1}',
    ],
)
def test_a_lease_without_a_finite_expiry_has_lapsed_and_says_so(tmp_path, body, caplog):
    storage = Storage(str(tmp_path))
    storage.write_text(body, lease_path(1))
    lease = Lease(storage, ttl_s=60)
    with caplog.at_level(logging.WARNING, logger="popflow.infra.store.lease"):
        lease.acquire(renew=False)
    assert lease.epoch == 2
    assert "00000001.json has no expiry that is a finite number" in caplog.text


@pytest.mark.unit
def test_a_folder_named_as_a_lease_file_counts_as_garbled(tmp_path):
    storage = Storage(str(tmp_path))
    (tmp_path / lease_path(1)).mkdir(parents=True)
    lease = Lease(storage, ttl_s=60)
    lease.acquire(renew=False)
    assert lease.epoch == 2


@pytest.mark.unit
def test_a_forged_pid_on_this_host_is_no_process(tmp_path, monkeypatch):
    """Where there is no /proc (macOS), a pid past a C int made os.kill overflow."""
    storage = Storage(str(tmp_path))
    forged = {"host": socket.gethostname(), "pid": 10**100, "id": "x", "expires": 4e9}
    storage.write_text(json.dumps(forged), lease_path(1))
    lease = Lease(storage, ttl_s=60)
    no_proc = types.SimpleNamespace(
        path=types.SimpleNamespace(isdir=lambda path: False), kill=os.kill, getpid=os.getpid
    )
    monkeypatch.setattr("popflow.infra.store.lease.os", no_proc)  # the lease module's only
    lease.acquire(renew=False)  # same host, no such process: gone at once
    assert lease.epoch == 2


# -- nine-digit epochs ----------------------------------------------------------------


def _garbled_at_99999999(storage: Storage) -> None:
    storage.write_text("garbage", lease_path(NINE_DIGITS - 1))


def check_nine_digit_epochs(storage: Storage) -> None:
    """A garbled lease at 99999999: the next driver takes 10**8, and a driver started
    after that file is gone must neither take an epoch below 10**8 nor hold beside it."""
    _garbled_at_99999999(storage)
    a = _elsewhere(storage)
    assert a.epoch == NINE_DIGITS
    assert storage.listdir(LEASE_DIR) == ["100000000.json", "99999999.json"]
    assert lease_holder(storage)["id"] == a.owner["id"]
    storage.remove_file(lease_path(NINE_DIGITS - 1))  # gone (pruned, or removed by hand)
    with pytest.raises(LeaseHeldError, match="is being run by pid"):
        Lease(storage, ttl_s=60).acquire(renew=False)
    a.check()  # still the holder
    fence(storage, NINE_DIGITS)
    b = Lease(storage, ttl_s=60, force=True)
    b.acquire(renew=False)
    assert b.epoch == NINE_DIGITS + 1
    with pytest.raises(LeaseLost, match="driver epoch 100000001 took"):
        a.check()
    with pytest.raises(LeaseLost, match="driver epoch 100000001 took"):
        fence(storage, NINE_DIGITS)
    assert a.renew_once() is False
    b.check()
    assert lease_epochs(storage) == [NINE_DIGITS, NINE_DIGITS + 1]


@pytest.mark.unit
def test_nine_digit_epochs_on_local_disk(tmp_path):
    check_nine_digit_epochs(Storage(str(tmp_path)))


@pytest.mark.integration
def test_nine_digit_epochs_on_s3(s3):
    check_nine_digit_epochs(s3)


@pytest.mark.unit
def test_force_takeover_gets_past_a_garbled_lease_at_99999999(tmp_path):
    """What ``popflow resume --force-takeover`` does (break the lease, then acquire it)."""
    storage = Storage(str(tmp_path))
    _elsewhere(storage, 1)
    _garbled_at_99999999(storage)
    assert break_lease(storage) is None  # the newest lease, 99999999, is garbled: no holder
    resumed = Lease(storage, ttl_s=60)
    resumed.acquire(renew=False)
    assert resumed.epoch == NINE_DIGITS + 1
    assert lease_epochs(storage) == [NINE_DIGITS, NINE_DIGITS + 1]
    assert lease_holder(storage)["id"] == resumed.owner["id"]


# -- names popflow never writes ---------------------------------------------------------


@pytest.mark.unit
def test_an_absurd_epoch_planted_in_the_lease_folder_is_skipped(tmp_path, caplog):
    storage = Storage(str(tmp_path))
    holder = _elsewhere(storage, 3)
    planted = "999999999999999999999.json"
    storage.write_text("garbage", LEASE_DIR, planted)
    holder.check()  # not taken over: no driver can have written that name
    fence(storage, 3)
    with (
        caplog.at_level(logging.WARNING, logger="popflow.infra.store.lease"),
        pytest.raises(LeaseHeldError, match="is being run by pid"),
    ):
        Lease(storage, ttl_s=60).acquire(renew=False)
    assert f"skipping {planted} in .popflow/lease" in caplog.text
    nxt = Lease(storage, ttl_s=60, force=True)
    nxt.acquire(renew=False)
    assert nxt.epoch == 4
    assert lease_epochs(storage) == [3, 4]


# -- a planted epoch at the top of the range ------------------------------------------------


@pytest.mark.unit
def test_a_garbled_lease_at_the_largest_epoch_locks_nobody(tmp_path, caplog):
    """No epoch is left above it: the driver taking over removes it, and takes the next
    epoch after the lease below it (which still holds, so only --force-takeover takes it)."""
    storage = Storage(str(tmp_path))
    _elsewhere(storage, 1)
    storage.write_text("garbage", lease_path(MAX_NUMBER))
    with (
        caplog.at_level(logging.WARNING, logger="popflow.infra.store.lease"),
        pytest.raises(LeaseHeldError, match="is being run by pid"),  # epoch 1's holder
    ):
        Lease(storage, ttl_s=60).acquire(renew=False)
    assert "removing 999999999999999.json in .popflow/lease" in caplog.text
    assert lease_epochs(storage) == [1]
    lease = Lease(storage, ttl_s=60, force=True)
    lease.acquire(renew=False)
    assert lease.epoch == 2


@pytest.mark.unit
def test_force_takeover_gets_past_a_lease_at_the_largest_epoch(tmp_path):
    """What ``popflow resume --force-takeover`` calls, with nobody else's lease below."""
    storage = Storage(str(tmp_path))
    storage.write_text("garbage", lease_path(MAX_NUMBER))
    assert break_lease(storage) is None  # garbled: nobody held it
    assert lease_epochs(storage) == [1]


@pytest.mark.unit
def test_a_lease_planted_just_below_the_largest_epoch_locks_nobody(tmp_path):
    """A driver takes the largest epoch after it; the next one, once that lease lapses,
    starts again below the planted range with an epoch none of the removed ones had, and
    the driver that held the removed one is fenced off (its lease file is gone)."""
    storage = Storage(str(tmp_path))
    storage.write_text("garbage", lease_path(MAX_NUMBER - 1))
    clock = Clock(storage.modified(lease_path(MAX_NUMBER - 1)))
    first = Lease(storage, ttl_s=60, clock=clock)
    first.owner["host"] = "elsewhere"
    first.acquire(renew=False)
    assert first.epoch == MAX_NUMBER
    clock.now += 121  # its holder stalls past its lease
    for expected in (1, 2, 3):  # and the drivers after it, each in turn
        nxt = Lease(storage, ttl_s=60, clock=clock)
        nxt.acquire(renew=False)
        assert nxt.epoch == expected
        nxt.release()
    with pytest.raises(
        LeaseLost, match=r"lease file \.popflow/lease/999999999999999\.json was removed"
    ):
        first.check()
    assert not first.renew_once()


# -- lease files that are no regular file, or too big ----------------------------------------


def _held_body() -> str:
    return json.dumps({"host": "elsewhere", "pid": 4242, "id": "x", "epoch": 1, "expires": 4e9})


def _plant(storage: Storage, kind: str) -> None:
    path = storage.path(lease_path(1))
    os.makedirs(os.path.dirname(path))
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link_loop":
        os.symlink(path, path)
    elif kind == "link_inside":  # a held lease, read through a link: popflow wrote no link
        storage.write_text(_held_body(), "elsewhere.json")
        os.symlink(storage.path("elsewhere.json"), path)
    elif kind == "too_big":  # a held lease, padded past what is read
        storage.write_text(_held_body()[:-1] + ', "pad": "' + "x" * 100_000 + '"}', lease_path(1))


@pytest.mark.unit
@pytest.mark.parametrize("kind", ["fifo", "link_loop", "link_inside", "too_big"])
@pytest.mark.parametrize("force", [False, True])
def test_a_lease_file_that_is_no_regular_file_or_too_big_counts_as_garbled(
    tmp_path, kind, force, caplog
):
    """A FIFO hung every reader (with --force-takeover too), a link loop raised
    StorageError, a link or a file past 64 KiB was read whole: each is a garbled lease."""
    storage = Storage(str(tmp_path))
    _plant(storage, kind)
    lease = Lease(storage, ttl_s=60, force=force)
    done = threading.Event()

    def acquire() -> None:
        try:
            lease.acquire(renew=False)
        finally:
            done.set()

    with caplog.at_level(logging.WARNING, logger="popflow.infra.store.lease"):
        thread = threading.Thread(target=acquire, daemon=True)
        thread.start()
        hung = not done.wait(30)
        if hung:  # a reader blocked in open(): a writer's open and close end its wait
            os.close(os.open(storage.path(lease_path(1)), os.O_WRONLY | os.O_NONBLOCK))
        thread.join(30)
    assert not hung, "reading the lease file hung"
    assert lease.epoch == 2
    assert "lease file .popflow/lease/00000001.json is garbled: it counts as lapsed" in caplog.text


@pytest.mark.unit
def test_a_lease_file_is_read_no_further_than_its_cap(tmp_path):
    """A sparse file of 64 GiB (no disk used) ran a reader out of memory."""
    path = tmp_path / "sparse"
    with open(path, "wb") as f:
        f.truncate(64 << 30)
    assert len(local_files.read_regular_file(str(path), MAX_LEASE_BYTES)) == MAX_LEASE_BYTES + 1


@pytest.mark.integration
def test_a_lease_object_past_the_cap_on_s3_counts_as_garbled(s3):
    _plant(s3, "too_big")
    lease = Lease(s3, ttl_s=60)
    lease.acquire(renew=False)
    assert lease.epoch == 2


# -- a modification time in the future ------------------------------------------------------


@pytest.mark.unit
def test_a_lease_file_modified_in_the_future_is_not_trusted(tmp_path, caplog):
    """Whoever can write the folder sets its mtime: 10 years ahead held the lease 10 years."""
    storage = Storage(str(tmp_path))
    storage.write_text(_held_body(), lease_path(1))
    far = time.time() + 10 * 365 * 86400
    os.utime(storage.path(lease_path(1)), (far, far))
    lease = Lease(storage, ttl_s=5)
    with caplog.at_level(logging.WARNING, logger="popflow.infra.store.lease"):
        lease.acquire(renew=False)
    assert lease.epoch == 2
    assert "lease file .popflow/lease/00000001.json was modified" in caplog.text


@pytest.mark.unit
def test_a_lease_file_modified_a_little_ahead_holds_for_two_ttls_after_that(tmp_path):
    """Within the tolerance for clock skew, the usual cap applies from its mtime."""
    storage = Storage(str(tmp_path))
    storage.write_text(_held_body(), lease_path(1))
    ahead = time.time() + FUTURE_TOLERANCE_S / 2
    os.utime(storage.path(lease_path(1)), (ahead, ahead))
    clock = Clock(ahead - FUTURE_TOLERANCE_S / 2)
    with pytest.raises(LeaseHeldError):
        Lease(storage, ttl_s=5, clock=clock).acquire(renew=False)
    clock.now = ahead + 11  # 2 x 5 s after that mtime
    assert Lease(storage, ttl_s=5, clock=clock).plan() == 2


@pytest.mark.unit
def test_an_epoch_pruned_before_a_planted_lease_is_never_taken_again(tmp_path):
    """The third adversarial pass: epoch 1 held by a driver that stalls; a lease planted at
    10**12 and a forced takeover above it prune epoch 1's file; a lease planted at the
    largest epoch is cleared by the next forced takeover, which started again at epoch 1:
    the stalled driver's check and renewal passed, two drivers under one epoch."""
    storage = Storage(str(tmp_path))
    stalled = Lease(storage, ttl_s=1.0)
    stalled.take(stalled.plan(), renew=False)
    assert stalled.epoch == 1
    storage.write_text("garbage", lease_path(10**12))
    above = Lease(storage, ttl_s=1.0, force=True)
    above.take(above.plan(), renew=False)
    assert above.epoch == 10**12 + 1
    storage.write_text("garbage", lease_path(MAX_NUMBER))
    cleared = Lease(storage, ttl_s=1.0, force=True)
    cleared.take(cleared.plan(), renew=False)
    assert cleared.epoch == 2
    with pytest.raises(LeaseLost, match="driver epoch 2 took the experiment over"):
        stalled.check()
    assert not stalled.renew_once()
    cleared.check()
