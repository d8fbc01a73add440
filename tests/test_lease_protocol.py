"""The lease and commit protocol under any interleaving (hypothesis' state machines).

Several drivers of one experiment start, stall, wake, renew, lapse, take over, die,
check their lease, publish commits (a check, then a create: another driver may act in
between) and have their workers publish checkpoints, in any order, on local disk and on
moto's S3 server. Whatever happens:

- every commit in storage is readable, and commit epochs never go down: once a newer
  driver committed, no older one does;
- a worker's publish passes its fence only while no newer lease exists;
- in the end, once every stalled driver wakes and tries to commit, exactly one does:
  the newest lease's holder, if it still runs (none if it died).

The drivers live on distinct (pretend) hosts, so only a lease's expiry, on a clock the
test moves, says whether its holder is gone, as for drivers on other machines.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from support.examples import examples as budget

from popflow.flows.experiment.opening import _take_over
from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import CommitConflict, ExperimentLog
from popflow.infra.store.layout import lease_path
from popflow.infra.store.lease import Lease, LeaseHeldError, LeaseLost, fence, lease_epochs

TTL = 60.0
DRIVERS = 3


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@dataclass
class Driver:
    """One driver as the test sees it: ``state`` idle (never started or gave up),
    planned (listed the leases, about to create its epoch), holding, dead or lost
    (stopped by LeaseLost or a conflict)."""

    name: str
    state: str = "idle"
    stalled: bool = False
    lease: Lease | None = None
    log: ExperimentLog | None = None
    planned: int = 0
    checked: bool = False  # passed its lease check; its commit comes next
    commits: list[int] = field(default_factory=list)


class LeaseProtocol(RuleBasedStateMachine):
    storage: Storage  # set by the subclass per store

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.drivers = [Driver(f"host-{i}") for i in range(DRIVERS)]
        self.round = 0

    # -- a driver's life ------------------------------------------------------
    def _new_lease(self, d: Driver) -> Lease:
        lease = Lease(self.storage, ttl_s=TTL, clock=self.clock)
        lease.owner.update(host=d.name, id=uuid.uuid4().hex)
        return lease

    def _pick(self, data: st.DataObject, *states: str, awake: bool = True) -> Driver:
        return data.draw(st.sampled_from(self._eligible(*states, awake=awake)))

    def _eligible(self, *states: str, awake: bool = True) -> list[Driver]:
        return [d for d in self.drivers if d.state in states and not (awake and d.stalled)]

    @precondition(lambda self: self._eligible("idle", "dead", "lost", awake=False))
    @rule(data=st.data())
    def plan(self, data: st.DataObject) -> None:
        """A driver starts: it lists the leases and picks its epoch."""
        self._start(self._pick(data, "idle", "dead", "lost", awake=False))

    def _start(self, d: Driver) -> None:
        d.lease, d.stalled, d.checked = self._new_lease(d), False, False
        try:
            d.planned = d.lease.plan()
        except LeaseHeldError:
            d.state = "idle"
            return
        d.state = "planned"

    @precondition(lambda self: self._eligible("idle", "dead", "lost", awake=False))
    @rule(data=st.data(), dies=st.booleans())
    def lapse_and_take_over(self, data: st.DataObject, dies: bool) -> None:
        """The holder's lease runs out and another driver takes over at once (and, with
        ``dies``, is killed right after): plan, take and kill as one step."""
        d = self._pick(data, "idle", "dead", "lost", awake=False)
        self.tick(TTL + 1)
        self._start(d)
        if d.state == "planned":
            self._take(d)
        if dies and d.state in ("planned", "holding"):
            d.state = "dead"

    @precondition(lambda self: self._eligible("planned"))
    @rule(data=st.data())
    def take(self, data: st.DataObject) -> None:
        """It creates the epoch it planned, then takes the experiment over."""
        self._take(self._pick(data, "planned"))

    def _take(self, d: Driver) -> None:
        assert d.lease is not None
        try:
            d.lease.take(d.planned, renew=False)
        except LeaseHeldError:
            d.state = "idle"
            return
        d.log = ExperimentLog(self.storage)
        d.log.epoch = d.lease.epoch
        try:
            if d.log.latest() is None:
                d.log.commit(self._payload(d))
            else:
                _take_over(d.log)
        except LeaseLost:  # CommitConflict included: a newer driver got there first
            d.state = "lost"
            return
        d.commits.append(d.log.seq)
        d.state = "holding"

    @precondition(lambda self: self._eligible("holding"))
    @rule(data=st.data())
    def check(self, data: st.DataObject) -> None:
        """Before a round's writes: the lease check."""
        self._check(self._pick(data, "holding"))

    def _check(self, d: Driver) -> None:
        if d.state != "holding":
            return
        assert d.lease is not None
        try:
            d.lease.check()
        except LeaseLost:
            assert max(lease_epochs(self.storage)) > d.lease.epoch
            d.state = "lost"
            return
        assert max(lease_epochs(self.storage)) == d.lease.epoch, "a superseded driver passed"
        d.checked = True

    @precondition(lambda self: [d for d in self._eligible("holding") if d.checked])
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        """The round's commit, some time after its check (others may act between)."""
        self._commit(
            data.draw(st.sampled_from([d for d in self._eligible("holding") if d.checked]))
        )

    def _commit(self, d: Driver) -> None:
        if not d.checked or d.state != "holding":
            return
        assert d.log is not None
        d.checked = False
        try:
            d.commits.append(d.log.commit(self._payload(d)))
        except CommitConflict:
            d.state = "lost"

    @precondition(lambda self: self._eligible("holding"))
    @rule(data=st.data())
    def renew(self, data: st.DataObject) -> None:
        d = self._pick(data, "holding")
        assert d.lease is not None
        if not d.lease.renew_once():
            d.state = "lost"

    @precondition(lambda self: self._eligible("holding", awake=False))
    @rule(data=st.data())
    def worker_publishes(self, data: st.DataObject) -> None:
        """A segment of this driver's (its workers run on while it stalls) publishes a
        checkpoint: only if no newer lease exists."""
        d = self._pick(data, "holding", awake=False)
        assert d.lease is not None
        newest = max(lease_epochs(self.storage), default=0)
        try:
            fence(self.storage, d.lease.epoch)
        except LeaseLost:
            assert newest > d.lease.epoch
            return
        assert newest == d.lease.epoch, "a worker published under a superseded lease"

    @precondition(lambda self: self._eligible("holding", "planned"))
    @rule(data=st.data())
    def stall(self, data: st.DataObject) -> None:
        self._pick(data, "holding", "planned").stalled = True

    @precondition(lambda self: [d for d in self.drivers if d.stalled])
    @rule(data=st.data())
    def wake(self, data: st.DataObject) -> None:
        data.draw(st.sampled_from([d for d in self.drivers if d.stalled])).stalled = False

    @precondition(lambda self: self._eligible("holding", "planned", awake=False))
    @rule(data=st.data())
    def kill(self, data: st.DataObject) -> None:
        """SIGKILL: its lease file stays until it lapses."""
        self._pick(data, "holding", "planned", awake=False).state = "dead"

    @rule(seconds=st.sampled_from([1.0, TTL + 1]))
    def tick(self, seconds: float) -> None:
        self.clock.now += seconds

    def _payload(self, d: Driver) -> dict:
        self.round += 1
        return {
            "trials": [],
            "round": self.round,
            "scheduler": {},
            "derived": {},
            "results": {},
            "writer": d.name,
        }

    # -- what must hold -------------------------------------------------------
    @invariant()
    def commits_are_readable_and_their_epochs_never_go_down(self) -> None:
        log = ExperimentLog(self.storage)
        numbers = log.commit_numbers()
        epochs = [log.read_record(n)["epoch"] for n in numbers]
        assert epochs == sorted(epochs), f"commits {numbers} have epochs {epochs}"
        if numbers:
            assert log.latest()["seq"] == numbers[-1]

    def teardown(self) -> None:
        """Every driver wakes and tries to commit: exactly the newest lease's live
        holder succeeds."""
        newest = max(lease_epochs(self.storage), default=0)
        writers = []
        for d in self.drivers:
            d.stalled = False
            if d.state != "holding":
                continue
            self._check(d)
            self._commit(d)
            if d.state == "holding":
                writers.append(d)
        holder = [d for d in self.drivers if d.lease is not None and d.lease.epoch == newest]
        live = [d for d in holder if d.state == "holding"]
        assert [d.name for d in writers] == [d.name for d in live]
        assert len(writers) <= 1
        self.commits_are_readable_and_their_epochs_never_go_down()


class LocalProtocol(LeaseProtocol):
    pass


class S3Protocol(LeaseProtocol):
    pass


@pytest.fixture
def local_storage(tmp_path_factory):
    return lambda: Storage(str(tmp_path_factory.mktemp("lease")))


def _run(machine: type[LeaseProtocol], make_storage, examples: int, first_epoch: int = 1) -> None:
    """``first_epoch``: the first driver's (a garbled, so lapsed, lease file sits below it)."""

    class Machine(machine):
        def __init__(self) -> None:
            self.storage = make_storage()
            if first_epoch > 1:
                self.storage.write_text("garbled", lease_path(first_epoch - 1))
            super().__init__()

    Machine.TestCase.settings = settings(
        max_examples=budget(examples),
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    Machine.TestCase().runTest()


@pytest.mark.unit
def test_leases_and_commits_on_local_disk(local_storage):
    _run(LocalProtocol, local_storage, examples=300)


@pytest.mark.unit
def test_leases_and_commits_across_nine_digit_epochs_on_local_disk(local_storage):
    """Takeovers from epoch 99999998 on reach 10**8, the first nine-digit name."""
    _run(LocalProtocol, local_storage, examples=100, first_epoch=99_999_998)


@pytest.mark.integration
def test_leases_and_commits_on_s3(s3_server, s3_bucket):
    _, options = s3_server
    _run(
        S3Protocol,
        lambda: Storage(f"s3://{s3_bucket}/lease-{uuid.uuid4().hex[:12]}", options),
        examples=20,
    )
