"""prefect.yaml deploys the benchmark flow to a real Prefect server, and a worker runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from popflow.flows.experiment.opening import is_finished
from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import ExperimentLog

pytestmark = pytest.mark.system

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


def work_until_done(run_output: str, tries: int = 5) -> str:
    """Run a process worker until the flow run ``prefect deployment run`` printed has ended
    (a worker pass can miss a run just scheduled); its final state, with its message."""
    import asyncio
    import re
    from uuid import UUID

    from prefect.client.orchestration import get_client

    match = re.search(r"UUID: ([0-9a-f-]{36})", run_output)
    assert match, run_output[-2000:]
    flow_run_id = UUID(match.group(1))

    async def state() -> tuple[str, str]:
        async with get_client() as client:
            run = await client.read_flow_run(flow_run_id)
        return run.state.type.value, run.state.message or ""

    for _ in range(tries):
        prefect("worker", "start", "--pool", "popflow-local", "--run-once", timeout=600)
        kind, message = asyncio.run(state())
        if kind not in ("SCHEDULED", "PENDING", "RUNNING"):
            assert kind == "COMPLETED", f"the flow run ended {kind}: {message}"
            return message
    raise AssertionError(f"the flow run is still {kind} after {tries} worker passes")


def uninterrupted_rounds(storage: Any) -> str:
    """``pbt-benchmark-rounds``' smoke experiment in one uninterrupted run, in this process;
    where it is."""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import cloudpickle
    import pbt_benchmark

    cloudpickle.register_pickle_by_value(pbt_benchmark)
    reference = pbt_benchmark.run_benchmark(
        storage=str(storage), name="pbt_benchmark_rounds", seed=0, smoke_test=True, synch=True
    )
    return reference.experiment_path


def test_deployment_runs_on_a_worker_and_resumes_on_rerun(prefect_server, tmp_path):
    prefect("work-pool", "create", "popflow-local", "--type", "process", "--overwrite")
    prefect("--no-prompt", "deploy", "--name", "pbt-benchmark-smoke")
    storage = str(tmp_path / "results")
    work_until_done(
        prefect(
            "deployment",
            "run",
            "pbt-benchmark/pbt-benchmark-smoke",
            "--param",
            f"storage={storage}",
        )
    )
    exp = Storage(storage).child("pbt_benchmark_smoke")
    commit = ExperimentLog(exp).latest()
    assert commit is not None and is_finished(commit)
    assert len(commit["trials"]) == 8
    # a second run of the deployment resumes ("auto"): the finished experiment is not redone
    work_until_done(
        prefect(
            "deployment",
            "run",
            "pbt-benchmark/pbt-benchmark-smoke",
            "--param",
            f"storage={storage}",
        )
    )
    assert ExperimentLog(exp).latest()["seq"] == commit["seq"]


def test_a_rounds_deployment_advances_the_experiment_a_budget_per_run(prefect_server, tmp_path):
    """What a scheduled trigger does, run by a real worker: each run of the
    ``pbt-benchmark-rounds`` deployment resumes and trains one round; the finished
    experiment equals an uninterrupted run's, and a later run has nothing to do."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import FlowRunSort
    from support.driving import read_experiment

    prefect("work-pool", "create", "popflow-local", "--type", "process", "--overwrite")
    prefect("--no-prompt", "deploy", "--name", "pbt-benchmark-rounds")
    storage = str(tmp_path / "results")
    exp = Storage(storage).child("pbt_benchmark_rounds")
    rounds = []
    for _ in range(3):
        work_until_done(
            prefect(
                "deployment",
                "run",
                "pbt-benchmark/pbt-benchmark-rounds",
                "--param",
                f"storage={storage}",
                "--param",
                "smoke_test=true",
                "--param",
                "max_rounds=1",
            )
        )
        commit = ExperimentLog(exp).latest()
        rounds.append((commit["round"], is_finished(commit)))
    assert rounds == [(1, False), (2, True), (2, True)]

    async def messages() -> list[str]:
        async with get_client() as client:
            runs = await client.read_flow_runs(sort=FlowRunSort.EXPECTED_START_TIME_DESC)
        return [r.state.message or "" for r in runs if r.parameters.get("name") == exp_name]

    exp_name = "pbt_benchmark_rounds"
    said = asyncio.run(messages())
    assert any("max_rounds=1 spent after round 1" in m for m in said)
    assert any(m.startswith("pbt_benchmark_rounds finished: 8 trials") for m in said)
    assert any(m == "pbt_benchmark_rounds had already finished: nothing to run" for m in said)

    assert read_experiment(exp.url) == read_experiment(uninterrupted_rounds(tmp_path / "ref"))


def test_the_generic_experiment_deployment_runs_json_parameters(prefect_server, tmp_path):
    """prefect.yaml's ``experiment`` deployment (flows/record/deployable.py), run by a worker
    with parameters as the UI would send them."""
    prefect("work-pool", "create", "popflow-local", "--type", "process", "--overwrite")
    prefect("--no-prompt", "deploy", "--name", "experiment")
    storage = str(tmp_path / "results")
    work_until_done(
        prefect(
            "deployment",
            "run",
            "popflow-experiment/experiment",
            "--param",
            f"storage={storage}",
            "--param",
            "num_samples=3",
            "--param",
            'stop={"training_iteration": 4}',
            # the owner's allowlists (these replace prefect.yaml's job variables' env)
            "--job-variable",
            "env="
            + json.dumps(
                {
                    "POPFLOW_TRAINABLE_ALLOWLIST": "popflow.tune.utils.mock_trainable",
                    "POPFLOW_STORAGE_ALLOWLIST": storage,
                }
            ),
        )
    )
    commit = ExperimentLog(Storage(storage).child("experiment")).latest()
    assert commit is not None and is_finished(commit) and len(commit["trials"]) == 3
