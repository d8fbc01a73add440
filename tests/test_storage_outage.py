"""Storage that goes away under a driver, and workers that do not see it, in one process:
the lease judges an outage longer than its ttl, a call whose outage the lease outlived goes
on, a worker that never answers the storage probe does not see the storage, a scheduler
nobody answers at is one line. (tests/test_several_hosts.py runs them on hosts.)"""

from __future__ import annotations

import os
import tempfile

import pytest

from popflow.infra.storage.errors import StorageError
from popflow.infra.storage.folder import Storage
from popflow.infra.storage.retry import RetryPolicy
from popflow.infra.store.lease import Lease, LeaseLost

OUTAGE = StorageError("listdir", "s3://b/x/.popflow/lease", "ConnectTimeoutError: no answer")


def _hold_until(path: str) -> None:
    """A task that holds its worker's thread until ``path`` exists (another run's segment)."""
    import time

    while not os.path.exists(path):
        time.sleep(0.02)


def _lease(now: list[float], ttl: float = 10.0) -> Lease:
    lease = Lease(Storage(tempfile.mkdtemp()), ttl_s=ttl, clock=lambda: now[0])
    lease.acquire(renew=False)
    return lease


@pytest.mark.unit
def test_an_answer_after_failures_that_outlasted_the_ttl_does_not_prove_the_lease():
    """Before: the renewal thread's success once storage was back made the lease proven
    again, and the driver stopped with a bare StorageError, or went on, by which of its
    threads saw storage first."""
    now = [1000.0]
    lease = _lease(now)
    now[0] += 4
    assert lease.outage(OUTAGE) is None  # a failure, inside the ttl: ridden out
    now[0] += 26  # no answer for 30 s, three times the ttl; then storage is back
    assert lease.renew_once() is False
    with pytest.raises(
        LeaseLost, match=r"its lease was not renewed for 30 s, longer than its lease \(10 s\)"
    ):
        lease.check()
    lost = lease.outage(OUTAGE)
    assert isinstance(lost, LeaseLost) and "popflow resume" in str(lost)


@pytest.mark.unit
def test_a_driver_that_only_stalled_keeps_its_lease_when_no_driver_took_over():
    now = [1000.0]
    lease = _lease(now)
    now[0] += 30  # stopped (SIGSTOP) past its ttl, storage never failed
    assert lease.renew_once() is True
    lease.check()


@pytest.mark.unit
def test_a_listing_that_answers_renews_nothing():
    """Before: a look that listed the lease folder counted as proof, so a renewal write
    refused for longer than the lease went on past its deadline (the extended retries)
    and got through after another driver had taken over."""
    now = [1000.0]
    lease = _lease(now)  # renewed at 1000
    now[0] = 1010.0
    lease.check()  # lists the lease folder: no newer driver
    now[0] = 1015.0
    assert not lease.answered_within(12)  # a call begun at 1003: no renewal since


@pytest.mark.unit
def test_a_call_that_ran_out_of_retries_goes_on_while_the_lease_shows_storage_answers():
    """A call that began in an outage the lease outlived (its renewal got through
    meanwhile) is not given up at its deadline: the run would stop while it holds."""
    storage = Storage(tempfile.mkdtemp(), retry=RetryPolicy(5, 0.01, 0.01, deadline=0.05))
    storage.is_local = False  # so a bare timeout is transient, as on an object store
    failures = [TimeoutError("timed out")] * 12

    def flaky() -> str:
        if failures:
            raise failures.pop()
        return "answered"

    with pytest.raises(StorageError, match="gave up after 5 attempts"):
        storage._call("read", "x", flaky)
    failures[:] = [TimeoutError("timed out")] * 6
    storage.answered_within = lambda seconds: True
    storage.retry = RetryPolicy(1000, 0.01, 0.01, deadline=10.0)
    assert storage._call("read", "x", flaky) == "answered"
    failures[:] = [TimeoutError("timed out")] * 1000  # bounded all the same
    storage.retry = RetryPolicy(1000, 0.01, 0.01, deadline=0.05)
    with pytest.raises(StorageError, match="gave up after"):
        storage._call("read", "x", flaky)
    storage.answered_within = lambda seconds: False  # the lease is lost: no more
    storage.retry = RetryPolicy(1, 0.01, 0.01, deadline=0.05)
    with pytest.raises(StorageError, match=r"gave up after 1 attempt in [0-9.]+ s\)"):
        storage._call("read", "x", flaky)


@pytest.mark.integration
def test_a_worker_that_never_answers_the_storage_probe_does_not_see_the_storage(monkeypatch):
    """Before: a probe that timed out was taken as seen, and the worker wrote its
    checkpoints to its own disk (a hung mount)."""
    from distributed import Client, LocalCluster

    import popflow.flows.backends.storage_probe as probes

    monkeypatch.setattr(probes, "PROBE_TIMEOUT_S", 2.0)
    root = tempfile.mkdtemp()
    probe = probes.StorageProbe(Storage(root))
    path = os.path.join(root, ".popflow", "storage_probe.json")
    os.remove(path)
    os.mkfifo(path)  # a read of it hangs until someone writes
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
        ) as c,
        Client(c) as client,
    ):
        workers = list(client.scheduler_info()["workers"])
        try:
            unseen = probe.unseen(client, workers)
        finally:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)  # let the hung read end
            os.write(fd, b"{}")
            os.close(fd)
    assert list(unseen) == workers
    assert "did not end within 2 s there (a hung mount?)" in unseen[workers[0]]


@pytest.mark.integration
def test_a_worker_whose_threads_are_busy_answers_the_storage_probe(monkeypatch):
    """Before: the probe was a task, which waited behind another run's segment holding the
    worker's one thread, and the run was refused ("a hung mount?")."""
    from distributed import Client, LocalCluster

    import popflow.flows.backends.storage_probe as probes

    monkeypatch.setattr(probes, "PROBE_TIMEOUT_S", 2.0)
    probe = probes.StorageProbe(Storage(tempfile.mkdtemp()))
    release = os.path.join(tempfile.mkdtemp(), "release")
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as c,
        Client(c) as client,
    ):
        busy = client.submit(_hold_until, release, pure=False)  # the worker's one thread
        try:
            assert probe.unseen(client, list(client.scheduler_info()["workers"])) == {}
        finally:
            open(release, "w").close()
            busy.result()


@pytest.mark.integration
def test_a_scheduler_nobody_answers_at_is_one_line_naming_it():
    import socket

    import dask

    from popflow.infra.cluster.dask_cluster import dask_client
    from popflow.infra.cluster.scheduler_link import SchedulerUnreachable

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    with (
        dask.config.set({"distributed.comm.timeouts.connect": "1s"}),
        pytest.raises(SchedulerUnreachable, match=rf"no Dask scheduler answers at {address} "),
        dask_client(address),
    ):
        pass


@pytest.mark.unit
def test_a_driver_that_lost_its_lease_makes_no_more_storage_calls():
    """Before: a driver whose lease was judged lost during an outage still made every
    call its exit made (retired checkpoints' deletions, log batches), each waiting out
    its connect timeouts and retries: on a loaded CI machine it had not exited 120 s on,
    its Dask client holding the workers the next runs needed."""
    now = [1000.0]
    storage = Storage(tempfile.mkdtemp(), retry=RetryPolicy(5, 0.01, 0.01, deadline=60.0))
    lease = Lease(storage, ttl_s=10.0, clock=lambda: now[0])
    lease.acquire(renew=False)
    storage.is_local = False  # so a timeout is transient, as on an object store
    storage.lease_lost = lease.lost
    calls: list[str] = []

    def unreachable() -> None:
        calls.append("tried")
        raise TimeoutError("connect timed out")

    now[0] += 11  # no renewal for longer than the ttl while storage fails: lost
    assert isinstance(lease.outage(OUTAGE), LeaseLost)
    with pytest.raises(LeaseLost, match=r"this driver \(epoch 1\) lost the lease of .*"):
        storage._call("remove", "t/checkpoint_000002", unreachable)
    assert calls == []
    assert "lease_lost" not in {k for k, v in storage.__getstate__().items() if v is not None}
