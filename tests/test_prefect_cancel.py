"""Cancel from Prefect: ``prefect flow-run cancel`` of a script's ``tune`` flow run stops
the experiment at the next segment's end, commits what finished, releases the lease and
ends the flow run Cancelled; ``popflow resume`` then goes on, and the experiment ends
identical to an uninterrupted run's (synchronous PBT)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support.driving import read_experiment
from support.polling import wait_for
from support.prefect_api import run_logs, tune_runs

from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import ExperimentLog

TESTS = os.path.dirname(os.path.abspath(__file__))
pytestmark = pytest.mark.system  # subprocess drivers, a deployment

POPFLOW = os.path.join(os.path.dirname(sys.executable), "popflow")

#: a synchronous PBT run of 4 trials, 6 rounds; its trials wait at iteration 3 (round 3)
#: until the file ``gate`` exists (the reference run: it does)
SCRIPT = textwrap.dedent(
    """
    import sys

    from trainables import GatedTrainable

    from popflow import run
    from popflow.schedulers import PopulationBasedTraining

    if __name__ == "__main__":
        storage, name, dask, gate = sys.argv[1:5]
        run(
            GatedTrainable,
            {"a": {"grid_search": [10, 20, 40, 30]}, "c": 1, "gate": gate, "gate_at": 3},
            scheduler=PopulationBasedTraining(
                time_attr="training_iteration",
                perturbation_interval=1,
                hyperparam_mutations={"c": [1, 2, 3]},
                synch=True,
            ),
            metric="mean_accuracy",
            mode="max",
            stop={"training_iteration": 6},
            storage=storage,
            name=name,
            seed=0,
            dask_address=dask,
        )
    """
)


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def _script(tmp_path: Path, storage: str, name: str, dask: str) -> subprocess.Popen:
    script = tmp_path / "cancel_me.py"
    script.write_text(SCRIPT)
    return subprocess.Popen(
        [sys.executable, str(script), storage, name, dask, str(tmp_path / "gate")],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _committed_round(path: str) -> int:
    try:
        latest = ExperimentLog(Storage(path)).latest()
    except Exception:  # not written yet
        return 0
    return int(latest.get("round", 0)) if latest else 0


def _running(name: str) -> bool:
    runs = tune_runs(name)
    return bool(runs) and runs[0].state is not None and runs[0].state.is_running()


def test_a_cancel_from_prefect_stops_commits_and_resumes_identical(tmp_path, tune_env):
    dask = tune_env["dask_address"].scheduler.address
    name = "cancelled"
    storage = str(tmp_path / "results")
    path = os.path.join(storage, name)
    proc = _script(tmp_path, storage, name, dask)
    try:
        # round 3 waits at the gate; the flow run is Running (it may start after the
        # first rounds: Prefect's import, its server)
        wait_for(lambda: (tmp_path / "gate.reached").exists(), 180, "round 3", interval_s=0.2)
        wait_for(lambda: _running(name), 180, "the tune flow run Running", interval_s=0.5)
        assert _committed_round(path) >= 2
        (flow_run,) = tune_runs(name)
        cancel = subprocess.run(
            [sys.executable, "-m", "prefect", "flow-run", "cancel", str(flow_run.id)],
            env=os.environ,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cancel.returncode == 0, cancel.stdout + cancel.stderr
        wait_for(
            lambda: any("was cancelled: the run stops" in line for line in run_logs(name)),
            60,
            "the cancel seen by the run",
            interval_s=0.5,
        )
        (tmp_path / "gate").touch()  # round 3's segments return: the run stops there
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = out.decode()
    assert proc.returncode == 0, said[-3000:]
    # a cancel is what the user asked: not "the Prefect record ... is incomplete" (before:
    # Prefect's TypeError on the Cancelled state carrying the results, warned every time)
    assert "is incomplete" not in said, said[-3000:]

    # ended Cancelled, saying what was committed and how to go on
    state = tune_runs(name)[0].state
    assert state.is_cancelled(), (state, said[-3000:])
    assert "cancelled from Prefect" in state.message, state.message
    assert f"popflow resume {path}" in state.message, state.message

    # the lease is released: no live driver, and `popflow status` says how to resume
    status = subprocess.run(
        [POPFLOW, "status", path], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert status.returncode == 0, status.stderr
    assert f"{name}: interrupted" in status.stdout, status.stdout
    assert "resume with: popflow resume" in status.stdout, status.stdout

    # popflow resume goes on to the end, identical to an uninterrupted run
    resumed = subprocess.run(
        [POPFLOW, "resume", path], env=_env(), capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    reference = _script(tmp_path, str(tmp_path / "reference"), name, dask)
    ref_out, _ = reference.communicate(timeout=300)
    assert reference.returncode == 0, ref_out.decode()[-3000:]
    assert read_experiment(path) == read_experiment(str(tmp_path / "reference" / name))


#: the same run as a deployment's flow: its ``tune`` flow run is a subflow
FLOW = SCRIPT.replace(
    'if __name__ == "__main__":\n    storage, name, dask, gate = sys.argv[1:5]\n',
    "from prefect import flow\n\n\n@flow\ndef cancel_me(storage: str, name: str, dask: str, gate: str) -> None:\n",
)


def test_a_deployments_run_cancelled_on_a_process_worker(tmp_path, tune_env):
    """A process worker's cancel of a deployment's run: SIGTERM to its process at once (after
    the cancel intent); both flow runs end Cancelled, what was committed stays, the lease
    is not left held, and a resume ends identical."""
    from support.prefect_api import api

    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "cancel_me.py").write_text(FLOW)
    dask = tune_env["dask_address"].scheduler.address
    name, pool = "deployed-cancel", f"popflow-cancel-{os.getpid()}"
    storage = str(tmp_path / "results")
    path = os.path.join(storage, name)
    gate = str(tmp_path / "gate")
    env = _env()
    subprocess.run(
        [sys.executable, "-m", "prefect", "work-pool", "create", pool, "--type", "process"],
        env=env, check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    deploy = textwrap.dedent(
        f"""
        from prefect import flow
        flow.from_source({str(tmp_path / "flows")!r}, "cancel_me.py:cancel_me").deploy(
            name="cancel-me", work_pool_name={pool!r}
        )
        """
    )
    subprocess.run([sys.executable, "-c", deploy], env=env, check=True, timeout=120)

    async def start(client):
        deployment = await client.read_deployment_by_name("cancel-me/cancel-me")
        return await client.create_flow_run_from_deployment(
            deployment.id,
            parameters={"storage": storage, "name": name, "dask": dask, "gate": gate},
        )

    parent = api(start)
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 (lives as long as the worker)
    worker = subprocess.Popen(
        [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(lambda: (tmp_path / "gate.reached").exists(), 300, "round 3", interval_s=0.5)
        wait_for(lambda: _running(name), 180, "the tune flow run Running", interval_s=0.5)
        cancel = subprocess.run(
            [sys.executable, "-m", "prefect", "flow-run", "cancel", str(parent.id)],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert cancel.returncode == 0, cancel.stdout + cancel.stderr

        async def parent_state(client):
            return (await client.read_flow_run(parent.id)).state

        wait_for(lambda: api(parent_state).is_cancelled(), 120, "the parent Cancelled", 0.5)
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        log.close()
    tune_state = tune_runs(name)[0].state  # not Crashed: the automation re-runs a crash
    assert tune_state.is_cancelled(), tune_state
    assert "cancelled from Prefect (its worker stopped the process)" in tune_state.message
    (tmp_path / "gate").touch()  # for the resume and the reference

    # the lease is not left held: `popflow status` says interrupted and how to resume
    def interrupted() -> bool:
        status = subprocess.run(
            [POPFLOW, "status", path], env=env, capture_output=True, text=True, timeout=120
        )
        return f"{name}: interrupted" in status.stdout

    wait_for(interrupted, 120, "the experiment interrupted (no live driver)", interval_s=1)
    resumed = subprocess.run(
        [POPFLOW, "resume", path], env=env, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    reference = _script(tmp_path, str(tmp_path / "reference"), name, dask)
    ref_out, _ = reference.communicate(timeout=300)
    assert reference.returncode == 0, ref_out.decode()[-3000:]
    assert read_experiment(path) == read_experiment(str(tmp_path / "reference" / name))
