"""prefect.yaml deploys the benchmark flow to a real Prefect server, and a worker runs it."""

from __future__ import annotations

import os
import subprocess
import sys

from popflow.flows.experiment import is_finished
from popflow.infra.experiment_log import ExperimentLog
from popflow.infra.storage import Storage

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def prefect(*args: str, timeout: float = 300) -> str:
    env = {**os.environ, "PWD": ROOT}  # the pull step's working directory
    proc = subprocess.run(
        [sys.executable, "-m", "prefect", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"prefect {' '.join(args)}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


def test_deployment_runs_on_a_worker_and_resumes_on_rerun(prefect_server, tmp_path):
    prefect("work-pool", "create", "popflow-local", "--type", "process", "--overwrite")
    prefect("--no-prompt", "deploy", "--name", "pbt-benchmark-smoke")
    storage = str(tmp_path / "results")
    prefect(
        "deployment", "run", "pbt-benchmark/pbt-benchmark-smoke", "--param", f"storage={storage}"
    )
    prefect("worker", "start", "--pool", "popflow-local", "--run-once", timeout=600)
    exp = Storage(storage).child("pbt_benchmark_smoke")
    commit = ExperimentLog(exp).latest()
    assert commit is not None and is_finished(commit)
    assert len(commit["trials"]) == 8
    # a second run of the deployment resumes ("auto"): the finished experiment is not redone
    prefect(
        "deployment", "run", "pbt-benchmark/pbt-benchmark-smoke", "--param", f"storage={storage}"
    )
    prefect("worker", "start", "--pool", "popflow-local", "--run-once", timeout=600)
    assert ExperimentLog(exp).latest()["seq"] == commit["seq"]
