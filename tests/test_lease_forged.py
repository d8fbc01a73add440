"""What a lease file says is data, not a promise: no lease file, however forged, garbled
or numbered, locks an experiment, and epochs are numbers at any digit count.

- A lease lapses at most 2 x the *reader's* ``lease_ttl`` after its file was written (by
  the storage's clock), whatever ttl or expiry the file claims.
- ``100000000.json`` (epoch 10**8, nine digits) is newer than ``99999999.json``: a garbled
  lease at 99999999 does not lock out the next driver or ``--force-takeover``, and no
  driver takes an epoch at or below one that exists.
- Names popflow cannot have written (an absurd epoch, padding it never writes) are
  skipped by every reader; a lease file at the largest epoch is refused, by name.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import types

import pytest

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


@pytest.mark.unit
def test_a_lease_file_at_the_largest_epoch_is_refused_by_name(tmp_path):
    storage = Storage(str(tmp_path))
    _elsewhere(storage, 1)
    storage.write_text("garbage", lease_path(MAX_NUMBER))
    for force in (False, True):
        with pytest.raises(LeaseHeldError, match=r"999999999999999\.json claims driver epoch"):
            Lease(storage, ttl_s=60, force=force).acquire(renew=False)
    assert lease_epochs(storage) == [1, MAX_NUMBER]  # nothing taken
    storage.remove_file(lease_path(MAX_NUMBER))  # the fix the message names
    lease = Lease(storage, ttl_s=60, force=True)
    lease.acquire(renew=False)
    assert lease.epoch == 2


@pytest.mark.unit
def test_force_takeover_refuses_a_lease_at_the_largest_epoch_in_one_line(tmp_path, capsys):
    """``popflow resume --force-takeover`` says which file to remove, with no traceback."""
    from trainables import ParityTrainable

    import popflow
    from popflow.flows.api.cli import main

    popflow.simulate(
        ParityTrainable, {"a": 1}, storage=str(tmp_path), name="exp", stop={"training_iteration": 2}
    )
    planted = tmp_path / "exp" / lease_path(MAX_NUMBER)
    planted.write_text("garbage")
    with pytest.raises(SystemExit) as exited:
        main(["resume", str(tmp_path / "exp"), "--force-takeover"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"popflow: {planted} claims driver epoch {MAX_NUMBER}")
    assert "remove that file" in err[-1]
    assert "Traceback" not in "\n".join(err)
