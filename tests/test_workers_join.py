"""Workers that join a running experiment get runners and take work: a synchronous PBT
run on a one-worker ``dask scheduler`` cluster uses a ``dask worker`` started mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support.polling import wait_for
from trainables import WhereTrainable

from popflow import CheckpointConfig, PopulationBasedTraining, run

pytestmark = pytest.mark.system

DASK = Path(sys.executable).with_name("dask")
HERE = Path(__file__).parent


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(HERE)}  # the workers import tests/trainables.py
    return subprocess.Popen(
        [str(DASK), *args], cwd=cwd, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _worker(address: str, folder: Path) -> subprocess.Popen:
    folder.mkdir()
    return _start(
        ["worker", address, "--nthreads", "1", "--host", "127.0.0.1",
         "--local-directory", str(folder)],
        folder,
    )  # fmt: skip


def test_a_worker_started_mid_run_takes_segments_of_a_synchronous_pbt_run(prefect_server, tmp_path):
    from distributed import Client

    scheduler_file = tmp_path / "scheduler.json"
    procs = [
        _start(["scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address",
                ":0", "--scheduler-file", str(scheduler_file)], tmp_path)
    ]  # fmt: skip
    try:
        wait_for(
            lambda: scheduler_file.exists() and scheduler_file.read_text().strip(),
            120,
            "no scheduler",
        )
        address = json.loads(scheduler_file.read_text())["address"]
        procs.append(_worker(address, tmp_path / "first"))
        client = Client(address, timeout=60)
        client.wait_for_workers(1, timeout=60)
        gate = tmp_path / "gate"
        out: dict = {}

        def tune() -> None:
            out["grid"] = run(
                WhereTrainable,
                {"a": 1, "c": 1, "gate": str(gate), "gate_at": 3, "sleep": 0.1},
                scheduler=PopulationBasedTraining(
                    time_attr="training_iteration",
                    perturbation_interval=2,
                    hyperparam_mutations={"c": [1, 2]},
                    synch=True,
                ),
                metric="mean_accuracy",
                mode="max",
                num_samples=4,
                stop={"training_iteration": 24},
                checkpoint_config=CheckpointConfig(checkpoint_frequency=2),
                storage=str(tmp_path / "results"),
                name="joined",
                seed=0,
                dask_address=client,
            )

        driver = threading.Thread(target=tune)
        driver.start()
        wait_for(lambda: Path(f"{gate}.reached").exists(), 120, "the run did not reach the gate")
        procs.append(_worker(address, tmp_path / "second"))
        client.wait_for_workers(2, timeout=60)
        gate.touch()
        driver.join(timeout=300)
        assert not driver.is_alive() and "grid" in out
        rows = [row for result in out["grid"] for row in result.history]
        assert {r["cwd"] for r in rows} == {str(tmp_path / "first"), str(tmp_path / "second")}
        later = [r for r in rows if r["cwd"] == str(tmp_path / "second")]
        assert len(later) >= 8, f"only {len(later)} results on the worker that joined"
        client.close()
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=30)
