"""Resume after the driver is SIGKILLed anywhere: nothing lost, nothing duplicated.

The driver runs as a subprocess (tests/crash_driver.py) in its own process
group; faults are injected by wrapping storage calls there and killing the
whole group (driver and its embedded Dask workers) with SIGKILL.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import subprocess
import sys

import pytest
from support.driving import DRIVER, drive, read_experiment

from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import ExperimentLog
from popflow.infra.store.layout import lease_path
from popflow.infra.store.lease import lease_holder

HERE = os.path.dirname(os.path.abspath(__file__))
#: the `popflow` command, as installed into the environment
POPFLOW = os.path.join(os.path.dirname(sys.executable), "popflow")


# 21 kill points spread over the run's 25 commits: inside derived-log appends,
# just before and just after a commit is published, inside checkpoint deletions
KINDS = ["append", "commit-before", "commit-after", "remove"]
KILL_PLAN = [f"{KINDS[k % 4]}:{n}" for k, n in enumerate(range(2, 23))]


@pytest.mark.system
def test_synch_pbt_killed_at_21_points_ends_identical(
    prefect_server, pbt_synch_reference, tmp_path
):
    reference = pbt_synch_reference
    assert reference["pbt_global"].count("\n") >= 4
    crashed = str(tmp_path / "crash")
    kills = 0
    for point in KILL_PLAN:
        code = drive(crashed, "exp", "pbt_synch", kill_at=point)
        kills += code != 0
    drive(crashed, "exp", "pbt_synch")  # the last resume runs to the end
    assert kills == len(KILL_PLAN), f"only {kills} of the planned kills happened"
    assert read_experiment(os.path.join(crashed, "exp")) == reference
    assert lease_holder(Storage(os.path.join(crashed, "exp"))) is None


@pytest.mark.system
@pytest.mark.parametrize(
    "scheduler", ["pbt_async", "asha", "hyperband", "median", "fifo", "pb2_synch"]
)
def test_every_scheduler_resumes_after_a_crash(prefect_server, tmp_path, scheduler):
    storage = str(tmp_path)
    # 12 iterations a trial are enough to crash after commit 3 and resume; PB2 runs the
    # driver's 24, which its exploits need (checked below)
    extra = [] if scheduler == "pb2_synch" else ["--iterations", "12"]
    assert drive(storage, "exp", scheduler, kill_at="commit-after:3", extra=extra) != 0
    drive(storage, "exp", scheduler, extra=extra)
    state = read_experiment(os.path.join(storage, "exp"))
    assert state["checkpoints_ok"]
    assert set(state["status"]) <= {"TERMINATED"}
    clones = {(line[2], line[3]) for line in map(json.loads, state["pbt_global"].splitlines())}
    for results in state["trials"].values():
        iters = [r["training_iteration"] for r in results]
        # nothing duplicated: iterations only go forward, except right after an
        # asynchronous PBT clone from a source that was behind (a logged exploit)
        for a, b in itertools.pairwise(iters):
            assert b == a + 1 or (a, b - 1) in clones, iters
    if scheduler == "pb2_synch":  # exploits happened: the GP's data came through the crash
        assert state["pbt_global"].count("\n") >= 4
    if scheduler in ("hyperband", "pb2_synch"):  # synchronous: the crash changes nothing
        drive(str(tmp_path / "ref"), "exp", scheduler, extra=extra)
        assert state == read_experiment(str(tmp_path / "ref" / "exp"))


class ListHandler(logging.Handler):
    """The messages of a logger, whatever Prefect's console handlers do."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.mark.system
def test_a_fresh_start_under_a_taken_name_starts_a_new_experiment(
    prefect_server, dask_cluster, tmp_path
):
    """Re-running a script never fails and never touches the old experiment: the new run
    is ``<name>_2`` (then ``_3``); resume=True still continues the old one."""
    from trainables import ParityTrainable

    from popflow import run

    storage = str(tmp_path)
    assert drive(storage, "exp", "fifo", kill_at="commit-after:2") != 0
    old_commits = sorted(os.listdir(os.path.join(storage, "exp", ".popflow", "commits")))
    kwargs = dict(num_samples=4, stop={"training_iteration": 24}, storage=storage, name="exp")
    kwargs["dask_address"] = dask_cluster  # the session's cluster: this is about names
    seen = ListHandler()
    logging.getLogger("popflow.flows.experiment.opening").addHandler(seen)
    try:
        fresh = run(ParityTrainable, {"a": 1, "c": 1}, **kwargs)
    finally:
        logging.getLogger("popflow.flows.experiment.opening").removeHandler(seen)
    assert fresh.experiment_path.endswith("/exp_2")
    warning = "holds an unfinished experiment; this run starts a new one, exp_2"
    assert any(warning in line for line in seen.lines), seen.lines
    assert [r.metrics["training_iteration"] for r in fresh] == [24] * 4
    assert sorted(os.listdir(os.path.join(storage, "exp", ".popflow", "commits"))) == old_commits
    with pytest.raises(ValueError, match="nothing to resume"):
        run(ParityTrainable, {"a": 1}, resume=True, **{**kwargs, "name": "other"})
    drive(storage, "exp", "fifo")
    # finished: a fresh run goes to the next free name
    again = run(ParityTrainable, {"a": 1, "c": 1}, **{**kwargs, "stop": {"training_iteration": 2}})
    assert again.experiment_path.endswith("/exp_3")
    # and resuming the finished one is a no-op that returns the same results
    commits = sorted(os.listdir(os.path.join(storage, "exp", ".popflow", "commits")))
    results = run(ParityTrainable, {"a": 1, "c": 1}, resume=True, **kwargs)
    assert sorted(os.listdir(os.path.join(storage, "exp", ".popflow", "commits"))) == commits
    assert [r.metrics["training_iteration"] for r in results] == [24] * 4


@pytest.mark.unit
def test_a_live_lease_keeps_a_second_driver_out(tmp_path):
    from popflow.infra.store.lease import Lease, LeaseHeldError

    storage = Storage(str(tmp_path))
    first = Lease(storage, ttl_s=30)
    first.acquire()
    try:
        with pytest.raises(LeaseHeldError, match="is being run by pid"):
            Lease(storage, ttl_s=30).acquire()
    finally:
        first.release()
    second = Lease(storage, ttl_s=30)
    second.acquire()  # released: free again
    assert lease_holder(storage)["id"] == second.owner["id"]
    second.release()
    assert lease_holder(storage) is None


@pytest.mark.system
def test_lease_of_a_dead_driver_is_taken_over(tmp_path):
    from popflow.infra.store.lease import Lease

    storage = Storage(str(tmp_path))
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    stale = {"host": os.uname().nodename, "pid": int(dead.stdout), "id": "x", "expires": 4e9}
    storage.write_text(json.dumps(stale), lease_path(1))
    lease = Lease(storage, ttl_s=30)
    lease.acquire()  # same host, owner process gone: no need to wait for the expiry
    lease.release()


@pytest.mark.system
def test_popflow_command_resumes_and_shows(prefect_server, pbt_synch_reference, tmp_path):
    storage = str(tmp_path)
    assert drive(storage, "exp", "pbt_synch", kill_at="commit-after:4") != 0
    path = os.path.join(storage, "exp")
    show = subprocess.run(
        [POPFLOW, "show", path],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "exp: unfinished, round 3" in show.stdout
    resumed = subprocess.run(
        [POPFLOW, "resume", path, "--n-workers", "2"],
        capture_output=True,
        text=True,
        cwd=HERE,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "exp: finished, 4 trials, 0 errors" in resumed.stdout
    show = subprocess.run(
        [POPFLOW, "show", path],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "exp: finished" in show.stdout
    assert read_experiment(path) == pbt_synch_reference


@pytest.mark.system
def test_truncated_checkpoint_is_detected_and_not_used(prefect_server, tmp_path):
    storage = str(tmp_path)
    assert drive(storage, "exp", "fifo", kill_at="commit-after:6") != 0
    path = os.path.join(storage, "exp")
    state = ExperimentLog(Storage(path)).latest()
    # commits 2..6 hold a checkpointed result each at least: 5 among 4 trials, so one
    # trial has an earlier good checkpoint to fall back to, whichever ran first
    victim = max(state["trials"], key=lambda t: len(t["checkpoints"]))
    assert len(victim["checkpoints"]) >= 2
    data = os.path.join(path, victim["restore"], "_dict_checkpoint.pkl")
    with open(data, "r+b") as f:
        f.truncate(3)
    logs: list[str] = []
    drive(storage, "exp", "fifo", logs=logs)
    assert f"checkpoint {victim['restore']} failed its check" in logs[0]
    final = read_experiment(path)
    assert set(final["status"]) == {"TERMINATED"} and final["checkpoints_ok"]
    # the trial went back to its previous checkpoint and trained on to the end
    iters = [r["training_iteration"] for r in final["trials"][victim["dirname"]]]
    assert iters[-1] == 24


@pytest.mark.system
def test_full_disk_stops_the_run_cleanly_and_resume_finishes_it(prefect_server, tmp_path):
    storage = str(tmp_path / "crash")
    proc = subprocess.run(
        [sys.executable, DRIVER, storage, "exp", "pbt_synch", "--kill-at", "enospc:5"],
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )
    assert proc.returncode != 0
    assert "No space left on device" in proc.stderr and "result.json" in proc.stderr
    state = ExperimentLog(Storage(os.path.join(storage, "exp"))).latest()
    assert state["seq"] == 5  # everything committed before the failure is intact
    drive(storage, "exp", "pbt_synch")
    drive(str(tmp_path / "ref"), "exp", "pbt_synch")
    assert read_experiment(os.path.join(storage, "exp")) == read_experiment(
        str(tmp_path / "ref" / "exp")
    )


@pytest.mark.integration
def test_prefect_flow_retry_resumes_instead_of_starting_over(prefect_server, tmp_path):
    from prefect import flow
    from trainables import ParityTrainable

    from popflow import CheckpointConfig, run
    from popflow.schedulers import FIFOScheduler

    marker = tmp_path / "failed-once"

    class FailingOnce(FIFOScheduler):
        def on_trial_result(self, trial, result):
            if result["training_iteration"] == 3 and not marker.exists():
                marker.touch()
                raise RuntimeError("driver failure in round 3")
            return super().on_trial_result(trial, result)

    @flow(retries=1)
    def nightly() -> list:
        results = run(
            ParityTrainable,
            {"a": 1},
            scheduler=FailingOnce(),
            num_samples=2,
            stop={"training_iteration": 6},
            checkpoint_config=CheckpointConfig(checkpoint_frequency=1),
            storage=str(tmp_path),
            name="retried",
            n_workers=1,
        )
        return [r.metrics["training_iteration"] for r in results]

    assert nightly() == [6, 6]
    assert marker.exists()  # the first attempt really failed
    log = ExperimentLog(Storage(str(tmp_path / "retried")))
    first = log.read(1)  # round 0 of the first attempt is still the experiment's first commit
    assert first["round"] == 0 and log.latest()["seq"] > 1
    with open(
        tmp_path / "retried" / f"ParityTrainable_{first['trials'][0]['trial_id']}" / "result.json"
    ) as f:
        assert [json.loads(line)["training_iteration"] for line in f] == [1, 2, 3, 4, 5, 6]


@pytest.mark.system
def test_pbt_replay_resumes_after_a_crash_identically(prefect_server, tmp_path):
    drive(str(tmp_path / "pbt"), "exp", "pbt_synch")
    exp = tmp_path / "pbt" / "exp"
    policy = max(exp.glob("pbt_policy_*.txt"), key=lambda p: len(p.read_text().splitlines()))
    env = {"POPFLOW_TEST_POLICY": str(policy)}
    assert drive(str(tmp_path / "crash"), "exp", "replay", kill_at="commit-after:2", env=env) != 0
    drive(str(tmp_path / "crash"), "exp", "replay", env=env)
    drive(str(tmp_path / "ref"), "exp", "replay", env=env)
    crashed = read_experiment(str(tmp_path / "crash" / "exp"))
    assert crashed == read_experiment(str(tmp_path / "ref" / "exp"))
    [history] = crashed["trials"].values()
    assert [r["training_iteration"] for r in history] == list(range(1, 25))


@pytest.mark.system
def test_storage_errors_in_a_fraction_of_operations_change_nothing(prefect_server, tmp_path):
    """15 % of storage calls (driver and workers) time out once or twice: the retries absorb
    them, and the run ends as an undisturbed one with the same seed."""
    clean = str(tmp_path / "clean")
    drive(clean, "pbt", "pbt_synch")
    faults = str(tmp_path / "faults.txt")
    options = {"failure_rate": 0.15, "fault_log": faults}
    drive(
        f"flaky://{tmp_path / 'flaky'}",
        "pbt",
        "pbt_synch",
        env={"POPFLOW_TEST_STORAGE_OPTIONS": json.dumps(options)},
    )
    with open(faults) as f:
        injected = [line.split() for line in f]
    assert len(injected) >= 20
    assert len({pid for pid, _, _ in injected}) >= 2  # the driver's calls and the workers'
    assert read_experiment(str(tmp_path / "flaky" / "pbt")) == read_experiment(f"{clean}/pbt")


@pytest.mark.system
def test_a_killed_drivers_runs_are_marked_crashed_when_another_resumes(prefect_server, tmp_path):
    """SIGKILL leaves the tune flow run and its round task Running in the API; the
    resuming driver marks them Crashed, saying who took over."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import FlowRunSort

    storage = str(tmp_path)
    name = f"killed-{tmp_path.name}"
    recorded = {"POPFLOW_TEST_KILL_RECORDED": name}  # the kill waits for the record
    said: list[str] = []
    assert drive(storage, name, "fifo", kill_at="commit-after:3", env=recorded, logs=said) != 0

    async def runs() -> list:
        async with get_client() as client:
            flow_runs = await client.read_flow_runs(sort=FlowRunSort.EXPECTED_START_TIME_DESC)
            mine = [r for r in flow_runs if (r.parameters or {}).get("name") == name]
            tasks = {
                r.id: await client.read_task_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[r.id]))
                )
                for r in mine
            }  # the session's server holds thousands: a first page may miss them
        return [
            (r.state.type.value, r.state.message or "",
             # state_type: the task run's own column (its state row may be a moment behind)
             sorted({t.state_type.value for t in tasks[r.id] if t.flow_run_id == r.id}))
            for r in sorted(mine, key=lambda r: r.created)
        ]  # fmt: skip

    before = asyncio.run(runs())
    # what the kill left behind
    assert [state for state, _, _ in before] == ["RUNNING"], said[0][-3000:]
    drive(storage, name, "fifo")
    killed, resumed = asyncio.run(runs())
    assert killed[0] == "CRASHED" and "taken over" in killed[1]
    assert "RUNNING" not in killed[2]
    assert resumed[0] == "COMPLETED"
