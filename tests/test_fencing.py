"""One driver, provably: leases and commits are created only if absent, and a driver
that a newer one has taken over stops, writing nothing more."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time

import pytest
from support.driving import DRIVER, drive, read_experiment
from support.lease_holder import hold_lease
from support.polling import wait_for

from popflow.flows.experiment.opening import _take_over
from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import CommitConflict, ExperimentLog
from popflow.infra.store.layout import lease_path
from popflow.infra.store.lease import (
    Lease,
    LeaseHeldError,
    LeaseLost,
    fence,
    lease_epochs,
    lease_holder,
)

TRIES = 30


def _contender(url: str, options: dict | None, start, done, results) -> None:
    """One of two processes taking the same lease at the same instant, TRIES times."""
    for i in range(TRIES):
        storage = Storage(f"{url}/race-{i}", options)
        lease = Lease(storage, ttl_s=60)
        start.wait()  # both call acquire() at once
        try:
            lease.acquire()
            won = True
        except LeaseHeldError:
            won = False
        results.put((i, won))
        done.wait()  # neither releases before both have tried
        if won:
            lease.release()


def race(url: str, options: dict | None = None) -> list[int]:
    """Winners per try when two processes acquire one lease at the same instant."""
    ctx = multiprocessing.get_context("spawn")
    start, done, results = ctx.Barrier(2), ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=_contender, args=(url, options, start, done, results)) for _ in range(2)
    ]
    for p in procs:
        p.start()
    winners = [0] * TRIES
    for _ in range(2 * TRIES):
        i, won = results.get(timeout=120)
        winners[i] += won
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return winners


@pytest.mark.system
def test_two_drivers_acquiring_at_once_on_local_disk_never_both_win(tmp_path):
    assert race(str(tmp_path)) == [1] * TRIES


@pytest.mark.integration
def test_two_drivers_acquiring_at_once_on_s3_never_both_win(s3_server, s3_url):
    _, options = s3_server
    assert race(s3_url, options) == [1] * TRIES


@pytest.mark.unit
def test_a_commit_is_never_written_twice(tmp_path):
    storage = Storage(str(tmp_path))
    first, second = ExperimentLog(storage), ExperimentLog(storage)
    first.epoch, second.epoch = 1, 2
    second.commit({"trials": [], "round": 0})
    with pytest.raises(CommitConflict, match="written by driver epoch 2") as info:
        first.commit({"trials": [], "round": 0})
    assert info.value.epoch == 2
    assert ExperimentLog(storage).latest()["epoch"] == 2


@pytest.mark.unit
def test_a_driver_woken_inside_its_takeover_after_a_newer_one_finished_commits_nothing(tmp_path):
    """Driver epoch 2 took the lease and stopped inside its takeover, before it read the
    newest commit; driver epoch 3 took over and finished. Epoch 2 wakes and reads epoch
    3's commit as the newest: it stops (LeaseLost). Before, it published its takeover
    marker after it (nothing conflicted: the newer driver wrote no more commits)."""
    storage = Storage(str(tmp_path))
    first, newer = ExperimentLog(storage), ExperimentLog(storage)
    first.epoch, newer.epoch = 1, 3
    commit = {"trials": [], "round": 1, "scheduler": {}, "derived": {}, "results": {}}
    first.commit(commit)
    newer.find_latest()
    newer.commit({**commit, "round": 2})
    storage.create_text('{"epoch": 3, "expires": 4e9}', lease_path(3))  # epoch 3's lease
    stale = ExperimentLog(storage)
    stale.epoch = 2
    with pytest.raises(LeaseLost, match="commit 2 was written by driver epoch 3"):
        _take_over(stale)
    assert ExperimentLog(storage).commit_numbers() == [1, 2]
    assert ExperimentLog(storage).latest()["epoch"] == 3


@pytest.mark.unit
def test_a_commit_naming_an_epoch_no_driver_held_does_not_lock_the_experiment(tmp_path):
    """A commit edited by hand (its checksum redone) to name epoch 10**12: every resume
    stopped with LeaseLost ('another driver took it over') though no lease above its own
    existed. It goes on now, with a warning, and its marker is the newest commit."""
    storage = Storage(str(tmp_path))
    forged = ExperimentLog(storage)
    forged.epoch = 10**12
    commit = {"trials": [], "round": 1, "scheduler": {}, "derived": {}, "results": {}}
    forged.commit(commit)
    storage.create_text('{"epoch": 2, "expires": 4e9}', lease_path(2))  # this driver's
    resumer = ExperimentLog(storage)
    resumer.epoch = 2
    latest, _ = _take_over(resumer)
    assert latest["round"] == 1
    assert ExperimentLog(storage).latest()["epoch"] == 2


@pytest.mark.unit
def test_a_driver_taken_over_fails_its_check_and_its_renewal_stops(tmp_path):
    storage = Storage(str(tmp_path))
    old = Lease(storage, ttl_s=60)
    old.acquire()
    old.check()  # still the holder
    # a newer driver's lease (as after this one stalled past its expiry)
    storage.create_text('{"epoch": 2, "expires": 4e9}', lease_path(old.epoch + 1))
    with pytest.raises(LeaseLost, match="lost the lease"):
        old.check()
    old.release()  # it leaves the newer lease alone
    assert storage.read_text(lease_path(2)) == '{"epoch": 2, "expires": 4e9}'


@pytest.mark.system
def test_a_zombie_driver_does_not_hold_its_lease(tmp_path):
    """SIGKILLed but not reaped by its parent: the process still shows, as a zombie."""
    storage = Storage(str(tmp_path))
    child = hold_lease(str(tmp_path))
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(LeaseHeldError):
            Lease(storage, ttl_s=600).acquire()  # alive: it holds the lease
        os.kill(child.pid, signal.SIGKILL)
        wait_for(lambda: _state(child.pid) == "Z", 60, "the kill to land (no reaping)")
        lease = Lease(storage, ttl_s=600)
        lease.acquire()  # a zombie holds nothing: taken over at once, not after 600 s
        assert lease_holder(storage)["pid"] == os.getpid()
        lease.release()
    finally:
        child.kill()
        child.wait()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def split_brain(storage: str, options: dict | None) -> tuple[int, str]:
    """Driver A stalls (SIGSTOP) right after commit 6, past its lease; B resumes and
    finishes; then A goes on (SIGCONT). A's return code and stderr."""
    env = {**os.environ, "POPFLOW_TEST_STORAGE_OPTIONS": json.dumps(options)}
    ttl = 3.0
    cmd = [sys.executable, DRIVER, storage, "exp", "pbt_synch"]
    stalled = subprocess.Popen(
        [*cmd, "--kill-at", "stop-after:6", "--lease-ttl", str(ttl)],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=env,
    )
    try:
        wait_for(lambda: _stopped(stalled), 300, "A to stop itself right after commit 6")
        holder = lease_holder(Storage(f"{storage}/exp", options))
        assert holder is not None and holder["pid"] == stalled.pid
        time.sleep(max(0.0, holder["expires"] - time.time()) + 0.2)  # its lease runs out
        drive(storage, "exp", "pbt_synch", env=env)  # B takes over and finishes
        os.kill(stalled.pid, signal.SIGCONT)
        _, err = stalled.communicate(timeout=120)
    finally:
        if stalled.poll() is None:
            os.killpg(stalled.pid, signal.SIGKILL)
    if options is not None:  # an uninterrupted run beside it (local: pbt_synch_reference)
        drive(f"{storage}-ref", "exp", "pbt_synch", env=env)
    return stalled.returncode, err


@pytest.mark.system
def test_a_stalled_driver_taken_over_stops_and_the_run_is_as_if_uninterrupted(
    prefect_server, pbt_synch_reference, tmp_path
):
    """Split brain on local disk: A must stop at once, and the experiment must be exactly
    an uninterrupted run's."""
    storage = str(tmp_path / "crashed")
    rc, err = split_brain(storage, None)
    assert rc != 0
    assert "LeaseLost" in err and "lost the lease" in err, err[-3000:]
    assert read_experiment(f"{storage}/exp") == pbt_synch_reference


@pytest.mark.system
def test_a_stalled_driver_taken_over_on_s3_stops_and_the_run_is_as_if_uninterrupted(
    prefect_server, s3_server, s3_url
):
    """The same split brain on moto's S3 server (leases and commits by conditional PUT)."""
    import s3fs
    from test_s3_tune import _experiment_on_s3

    _, options = s3_server
    storage = f"{s3_url}/crashed"
    rc, err = split_brain(storage, options)
    assert rc != 0
    assert "LeaseLost" in err and "lost the lease" in err, err[-3000:]
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    crashed = _experiment_on_s3(fs, f"{storage}/exp".removeprefix("s3://"))
    reference = _experiment_on_s3(fs, f"{storage}-ref/exp".removeprefix("s3://"))
    assert crashed == reference and len(crashed["trials"]) == 4


def _wait_lapsed(storage: Storage, timeout: float = 60.0) -> None:
    """Poll until no driver holds the lease (the stalled one's expiry passed)."""
    wait_for(lambda: lease_holder(storage) is None, timeout, "the stalled driver's lease to lapse")


def _stopped(proc: subprocess.Popen) -> bool:
    """Whether ``proc`` has stopped (SIGSTOP); it must not have exited."""
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    return _state(proc.pid) == "T"


def _holds_the_lease(proc: subprocess.Popen, experiment: Storage) -> bool:
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    return (lease_holder(experiment) or {}).get("pid") == proc.pid


def takeovers_of_a_stalled_driver(storage: str, options: dict | None) -> tuple[int, str, int, str]:
    """Driver A stalls (SIGSTOP) after commit 6, past its lease; B and C take it over in
    turn and die right after taking it (SIGKILL); D runs, and while it does A goes on
    (SIGCONT). A's and D's return codes and stderr."""
    env = {**os.environ, "POPFLOW_TEST_STORAGE_OPTIONS": json.dumps(options)}
    cmd = [sys.executable, DRIVER, storage, "exp", "pbt_synch", "--lease-ttl", "3"]
    experiment = Storage(f"{storage}/exp", options)

    def start(*extra: str) -> subprocess.Popen:
        return subprocess.Popen(
            [*cmd, *extra], stderr=subprocess.PIPE, text=True, start_new_session=True, env=env
        )

    stalled = start("--kill-at", "stop-after:6")
    procs = [stalled]
    try:
        wait_for(lambda: _stopped(stalled), 300, "A to stop itself right after commit 6")
        _wait_lapsed(experiment)
        for _ in range(2):  # B and C
            dying = start("--kill-at", "took-lease:0")
            procs.append(dying)
            dying.communicate(timeout=300)
            assert dying.returncode == -signal.SIGKILL
        live = start()
        procs.append(live)
        wait_for(lambda: _holds_the_lease(live, experiment), 300, "D to take the lease")
        assert lease_epochs(experiment)[-1] == 4  # D holds epoch 4; epoch 2 was pruned
        os.kill(stalled.pid, signal.SIGCONT)
        _, stalled_err = stalled.communicate(timeout=300)
        _, live_err = live.communicate(timeout=300)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    return stalled.returncode, stalled_err, live.returncode, live_err


@pytest.mark.system
def test_a_stalled_driver_loses_to_the_third_driver_after_it(
    prefect_server, pbt_synch_reference, tmp_path
):
    """The issue's split brain: after three takeovers A must stop at once with
    LeaseLost (it used to finish, and kill D with a CommitConflict), D must finish, and
    the experiment must be exactly an uninterrupted run's."""
    storage = str(tmp_path / "crashed")
    rc_a, err_a, rc_d, err_d = takeovers_of_a_stalled_driver(storage, None)
    assert rc_d == 0, err_d[-3000:]
    assert rc_a != 0 and "LeaseLost" in err_a and "driver epoch 4" in err_a, err_a[-3000:]
    assert lease_epochs(Storage(f"{storage}/exp"))[-1] == 4  # A wrote no lease file again
    assert read_experiment(f"{storage}/exp") == pbt_synch_reference


@pytest.mark.unit
def test_a_taken_over_drivers_worker_publishes_no_checkpoint(tmp_path):
    """The new driver's checkpoint at a name the old driver's worker also reaches
    stays as it is: the old worker's publish is fenced off, leaving nothing behind."""
    from popflow.infra.store.checkpoints import fetch_checkpoint, publish_checkpoint

    storage = Storage(str(tmp_path))
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "state").write_text("new driver")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "state").write_text("old driver")
    storage.create_text("{}", lease_path(2))  # driver 2 took over from driver 1
    publish_checkpoint(storage, str(ours), "trial/checkpoint_000001", {"by": 2})
    with pytest.raises(LeaseLost, match="driver epoch 2 took"):
        publish_checkpoint(
            storage, str(theirs), "trial/checkpoint_000001", {"by": 1}, lambda: fence(storage, 1)
        )
    assert fetch_checkpoint(storage, "trial/checkpoint_000001", str(tmp_path / "out")) == {"by": 2}
    assert (tmp_path / "out" / "state").read_text() == "new driver"
    assert storage.listdir("trial") == ["checkpoint_000001"]  # no temporary folder left
    fence(storage, 2)  # the holder itself is not fenced


class Clock:
    """A wall clock the test moves by hand (the lease compares expiries with it)."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _driver(storage: Storage, clock: Clock, host: str) -> Lease:
    """A driver on another host (so only its lease's expiry says whether it is gone)."""
    lease = Lease(storage, ttl_s=60, clock=clock)
    lease.owner["host"] = host
    lease.acquire(renew=False)
    return lease


def several_takeovers(storage: Storage) -> tuple[Lease, Lease]:
    """Driver A stalls; B, C and D take over in turn, each after the one before lapsed
    (B and C die right after taking it). A and D."""
    clock = Clock()
    a = _driver(storage, clock, "a")
    for host in ("b", "c", "d"):
        clock.now += 61  # the holder's lease runs out
        holder = _driver(storage, clock, host)
    return a, holder


@pytest.mark.integration
@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_driver_taken_over_several_times_is_fenced_whatever_was_pruned(where, tmp_path, request):
    """Pruning removed A's successor's lease file (epoch 2): A must still see epoch 4."""
    if where == "s3":
        _, options = request.getfixturevalue("s3_server")
        storage = Storage(request.getfixturevalue("s3_url"), options)
    else:
        storage = Storage(str(tmp_path))
    a, d = several_takeovers(storage)
    assert 2 not in lease_epochs(storage)  # what broke the look for epoch + 1 only
    with pytest.raises(LeaseLost, match="driver epoch 4 took the experiment over"):
        a.check()
    with pytest.raises(LeaseLost, match="driver epoch 4 took"):
        fence(storage, 1)  # A's workers publish nothing
    assert a.renew_once() is False  # its renewal stops, and writes no lease 1 again
    a.release()
    assert lease_epochs(storage) == [3, 4]
    d.check()
    fence(storage, 4)  # the holder is not fenced
    assert lease_holder(storage)["host"] == "d"


class StallsBeforeCreating(Storage):
    """Storage whose first create runs ``meanwhile`` first: a driver that listed the
    leases, then stalled before creating the epoch it computed."""

    def create_text(self, text: str, *parts: str, durable: bool = False) -> bool:
        meanwhile, self.meanwhile = getattr(self, "meanwhile", None), None
        if meanwhile is not None:
            meanwhile()
        return super().create_text(text, *parts, durable=durable)


@pytest.mark.unit
def test_a_driver_creating_a_pruned_epoch_gives_it_back(tmp_path):
    """It listed [1], computed epoch 2 and stalled while B, C and D took epochs 2-4
    (pruning 1 and 2); its create of epoch 2 then succeeds, but it must not hold."""
    storage = Storage(str(tmp_path))
    clock = Clock()
    _driver(storage, clock, "a")
    clock.now += 61

    def three_takeovers() -> None:
        for host in ("b", "c", "d"):
            _driver(storage, clock, host)
            clock.now += 61
        clock.now -= 61  # d's lease is live

    late = Lease(StallsBeforeCreating(str(tmp_path)), ttl_s=60, clock=clock)
    late.storage.meanwhile = three_takeovers
    with pytest.raises(LeaseHeldError, match="driver epoch 4 took the lease"):
        late.acquire(renew=False)
    assert lease_epochs(storage) == [3, 4]  # its epoch 2 is given back
    assert lease_holder(storage)["host"] == "d"


@pytest.mark.unit
def test_a_lease_forged_far_in_the_future_lapses_two_ttls_after_it_was_written(tmp_path):
    """A forged lease (or one from a host whose clock runs days ahead) holds the
    experiment at most 2 x lease_ttl after its last write, by the storage's clock."""
    storage = Storage(str(tmp_path))
    forged = {"host": "elsewhere", "pid": 1, "id": "x", "epoch": 1, "expires": 4e9}
    storage.write_text(json.dumps(forged), lease_path(1))
    written = storage.modified(lease_path(1))
    clock = Clock()
    clock.now = written + 119
    with pytest.raises(LeaseHeldError, match="force-takeover"):
        Lease(storage, ttl_s=60, clock=clock).acquire(renew=False)
    clock.now = written + 121
    lease = Lease(storage, ttl_s=60, clock=clock)
    lease.acquire(renew=False)
    assert lease.epoch == 2


@pytest.mark.unit
def test_force_takeover_takes_a_held_lease_and_fences_its_holder(tmp_path):
    storage = Storage(str(tmp_path))
    holder = Lease(storage, ttl_s=600)
    holder.acquire(renew=False)
    with pytest.raises(LeaseHeldError):
        Lease(storage, ttl_s=600).acquire(renew=False)
    forced = Lease(storage, ttl_s=600, force=True)
    forced.acquire(renew=False)
    assert forced.epoch == 2
    with pytest.raises(LeaseLost, match="driver epoch 2 took"):
        holder.check()
    forced.check()


@pytest.mark.unit
@pytest.mark.parametrize(
    "body", ['{"expires": "soon"}', "[1, 2]", '{"pid": "x", "host": 3, "expires": NaN}', "garbage"]
)
def test_a_garbled_lease_file_counts_as_lapsed(tmp_path, body):
    storage = Storage(str(tmp_path))
    storage.write_text(body, lease_path(1))
    lease = Lease(storage, ttl_s=60)
    lease.acquire(renew=False)
    assert lease.epoch == 2


@pytest.mark.unit
def test_breaking_a_lease_frees_the_experiment_and_fences_its_holder(tmp_path):
    from popflow.infra.store.lease import break_lease

    storage = Storage(str(tmp_path))
    holder = Lease(storage, ttl_s=600)
    holder.acquire(renew=False)
    assert break_lease(storage)["id"] == holder.owner["id"]
    assert lease_holder(storage) is None  # free: the next driver takes it at once
    with pytest.raises(LeaseLost):
        holder.check()
    nxt = Lease(storage, ttl_s=600)
    nxt.acquire(renew=False)
    assert nxt.epoch == 3
    assert break_lease(Storage(str(tmp_path / "nobody"))) is None


@pytest.mark.unit
def test_the_guard_looks_in_storage_once_a_while_and_again_after_a_stall(tmp_path):
    """A look is a listing: the guard a driver calls before each write looks at most every
    ``every_s``, so a driver stopped for longer (SIGSTOP past its lease) looks before its
    next write and stops there."""
    storage = Storage(str(tmp_path))
    clock = Clock()
    holder = Lease(storage, ttl_s=60, clock=clock)
    holder.acquire(renew=False)
    now = [0.0]
    guard = holder.guard(every_s=0.05, monotonic=lambda: now[0])
    guard()  # looks: still the holder
    clock.now += 61
    Lease(storage, ttl_s=60, clock=clock).acquire(renew=False)  # taken over meanwhile
    now[0] += 0.01
    guard()  # within 50 ms of its look: it does not look again
    now[0] += 10.0  # the stall
    with pytest.raises(LeaseLost, match="driver epoch 2 took"):
        guard()


@pytest.mark.unit
def test_a_finished_experiment_with_an_orphan_checkpoint_opens(tmp_path):
    """The chaos run (seed 7, ASHA) after c9a5f66: a finished experiment holding an orphan
    checkpoint published by driver epoch 3 could not be opened again ('published by a
    driver newer than this one (epoch 0)'): opening a finished one takes no lease."""
    from trainables import ParityTrainable

    from popflow import simulate
    from popflow.infra.store.checkpoints import publish_checkpoint

    kwargs = dict(
        param_space={"a": 1.0},
        num_samples=2,
        stop={"training_iteration": 2},
        storage=str(tmp_path / "results"),
        name="exp",
    )
    simulate(ParityTrainable, **kwargs)
    exp = Storage(str(tmp_path / "results" / "exp"))
    trial = ExperimentLog(exp).latest()["trials"][0]["dirname"]
    src = tmp_path / "orphan"
    src.mkdir()
    (src / "w.bin").write_bytes(b"x")
    publish_checkpoint(exp, str(src), f"{trial}/checkpoint_000099_e3", {"epoch": 3})
    again = simulate(ParityTrainable, **kwargs, resume=True)
    assert len(again.grid) == 2
