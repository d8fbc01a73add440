"""Recovery without a person, on a real Prefect server with its services and a real
process worker: a SIGKILLed deployed run is re-run by ``automations.yaml`` and finishes
with nothing lost; an interval schedule advances an experiment a budget per run."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest
from conftest import prefect_server_process, using_prefect_server
from support.driving import read_experiment
from support.polling import wait_for
from support.prefect_api import api
from test_deployment import ROOT, prefect, uninterrupted_rounds

from popflow.flows.experiment.opening import is_finished
from popflow.flows.spec import storage_roots
from popflow.flows.spec.trainable_paths import ALLOWLIST_ENV
from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import ExperimentLog

HERE = os.path.dirname(os.path.abspath(__file__))
#: Seconds a test waits for the server's services and the worker before it gives up.
DEADLINE_S = 240.0


@pytest.fixture(scope="module")
def services_server(prefect_server: str) -> Iterator[str]:
    """A Prefect server of this module's own, whose scheduler looks every second (the
    default is a minute), with a process worker on the pool ``popflow-local``. Made
    after the session's server (``prefect_server``), so that it ends first and the
    session's settings come back after it."""
    with (
        prefect_server_process(PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="1") as (url, home),
        using_prefect_server(url, home),
    ):
        prefect("work-pool", "create", "popflow-local", "--type", "process", "--overwrite")
        prefect("automation", "create", "--from-file", "automations.yaml")
        env = {
            **os.environ,
            "PWD": ROOT,
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "PYTHONPATH": HERE,  # the flow-run processes import trainables.py
        }
        log = open(os.path.join(home, "worker.log"), "wb")  # noqa: SIM115 (as long as the worker)
        worker = subprocess.Popen(
            [sys.executable, "-m", "prefect", "worker", "start", "--pool", "popflow-local"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield url
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            try:  # it took its whole 30 s to stop, each time: 5 s, then it is killed
                worker.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(timeout=30)
            log.close()


def flow_run_id(run_output: str) -> UUID:
    import re

    match = re.search(r"UUID: ([0-9a-f-]{36})", run_output)
    assert match, run_output[-2000:]
    return UUID(match.group(1))


def unfinished_runs() -> list[str]:
    """Flow runs and task runs the API still has Running or Pending."""
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    busy = [StateType.RUNNING, StateType.PENDING]

    async def call(client: Any) -> list[str]:
        flows = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=busy))
            )
        )
        tasks = await client.read_task_runs(
            task_run_filter=TaskRunFilter(
                state=TaskRunFilterState(type=TaskRunFilterStateType(any_=busy))
            )
        )
        return [f"flow run {r.name} {r.state_name}" for r in flows] + [
            f"task run {t.name} {t.state_name}" for t in tasks
        ]

    return api(call)


def experiment_params(storage: str, gate: str) -> dict[str, Any]:
    """Synchronous PBT of GatedTrainable, whose trials stop at iteration 5 until ``gate``
    exists; as the ``experiment`` deployment's JSON parameters."""
    return {
        "trainable": "trainables:GatedTrainable",
        "param_space": {"a": {"uniform": [0, 1]}, "gate": gate, "gate_at": 5},
        "scheduler": "pbt",
        "scheduler_args": {
            "time_attr": "training_iteration",
            "perturbation_interval": 2,
            "synch": True,
            "hyperparam_mutations": {"a": {"uniform": [0, 1]}},
        },
        "metric": "mean_accuracy",
        "mode": "max",
        "num_samples": 4,
        "stop": {"training_iteration": 8},
        "storage": storage,
        "name": "recovered",
        "seed": 3,
    }


@pytest.mark.system
def test_a_sigkilled_deployed_run_is_rerun_and_finishes_with_nothing_lost(
    services_server, tmp_path, monkeypatch
):
    prefect("--no-prompt", "deploy", "--name", "experiment")
    gate = str(tmp_path / "gate")
    params = experiment_params(str(tmp_path / "results"), gate)
    # the deployment runs only the trainables its owner allows: these tests' own
    allowed = json.dumps(
        {ALLOWLIST_ENV: "trainables", storage_roots.ALLOWLIST_ENV: str(tmp_path / "results")}
    )
    run_id = flow_run_id(
        prefect(
            "deployment",
            "run",
            "popflow-experiment/experiment",
            "--params",
            json.dumps(params),
            "--job-variable",
            f"env={allowed}",
        )
    )
    # mid-round 3: a trial waits at iteration 5; rounds 1 and 2 are committed
    wait_for(lambda: os.path.exists(gate + ".reached"), DEADLINE_S, "a trial at the gate")
    exp = Storage(str(tmp_path / "results")).child("recovered")
    before = ExperimentLog(exp).latest()
    assert before["round"] == 2 and not is_finished(before)

    def round_3_running() -> bool:  # the record catches up with the training
        tune_runs = api(lambda c: c.read_flow_runs(flow_run_filter=_child_of(run_id)))
        tasks = [
            (t.name, t.state_name)
            for r in tune_runs
            for t in api(lambda c, r=r: c.read_task_runs(task_run_filter=_tasks_of(r.id)))
        ]
        return ("round-3", "Running") in tasks

    wait_for(round_3_running, DEADLINE_S, "round 3 running in the Prefect UI")
    run = api(lambda c: c.read_flow_run(run_id))
    pid = int(str(run.infrastructure_pid).rsplit(":", 1)[-1])
    os.kill(pid, signal.SIGKILL)  # the flow-run process: the driver, with its Dask cluster
    killed = time.monotonic()
    with open(gate, "w"):
        pass  # the re-run's trials pass the gate

    def ended() -> Any:
        run = api(lambda c: c.read_flow_run(run_id))
        return run if run.state.is_final() and run.run_count > 1 else None

    run = wait_for(ended, DEADLINE_S, "the killed run re-run to its end")
    recovered_s = time.monotonic() - killed
    history = api(lambda c: c.read_flow_run_states(run_id))
    names = [s.name for s in history]
    print(f"\nSIGKILL to the re-run's end: {recovered_s:.1f} s; states {names}")
    assert run.state.type.value == "COMPLETED", run.state.message
    assert run.run_count == 2  # re-run once, by the automation
    assert run.state.message.startswith("recovered finished: 4 trials, 0 errors")
    assert "Crashed" in names and "Rerun" in names, names
    assert unfinished_runs() == []
    # the re-run got its tune subflow run back; the killed attempt's round in it was
    # marked as taken over, and the rounds after it ran under the re-run
    (tune_run,) = api(lambda c: c.read_flow_runs(flow_run_filter=_child_of(run_id)))
    assert tune_run.state_name == "Completed"
    rounds = api(lambda c: c.read_task_runs(task_run_filter=_tasks_of(tune_run.id)))
    states = sorted((r.name, r.state_name) for r in rounds)
    assert states == [
        ("round-1", "Completed"),
        ("round-2", "Completed"),
        ("round-3", "Completed"),
        ("round-3", "Superseded"),
        ("round-4", "Completed"),
    ], states

    # nothing lost: the same experiment in one uninterrupted run
    from popflow.flows.record.deployable import experiment

    sys.path.insert(0, HERE)
    monkeypatch.setenv(ALLOWLIST_ENV, "trainables")
    monkeypatch.setenv(storage_roots.ALLOWLIST_ENV, str(tmp_path / "ref"))
    reference = experiment(**{**params, "storage": str(tmp_path / "ref")})
    assert read_experiment(exp.url) == read_experiment(reference["experiment"])


def _tasks_of(flow_run: UUID) -> Any:
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterFlowRunId

    return TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=[flow_run]))


def _child_of(parent: UUID) -> Any:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    return FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent]))


@pytest.mark.system
def test_an_interval_schedule_advances_the_experiment_a_budget_per_run(services_server, tmp_path):
    """``pbt-benchmark-rounds`` on a 5 s interval, one round per run: the scheduler's runs
    each resume and advance the experiment until it has finished, one at a time; later
    runs say so; the result equals an uninterrupted run's."""
    storage = str(tmp_path / "results")
    prefect(
        "--no-prompt",
        "deploy",
        "--name",
        "pbt-benchmark-rounds",
        "--interval",
        "5",
        "--param",
        f"storage={storage}",
        "--param",
        "smoke_test=true",
        "--param",
        "max_rounds=1",
    )
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterName,
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    def completed() -> list[Any]:
        runs = api(
            lambda c: c.read_flow_runs(
                deployment_filter=DeploymentFilter(
                    name=DeploymentFilterName(any_=["pbt-benchmark-rounds"])
                ),
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(
                        type=FlowRunFilterStateType(any_=[StateType.COMPLETED])
                    )
                ),
            )
        )
        return runs if len(runs) >= 3 else []

    runs = wait_for(completed, DEADLINE_S, "three scheduled runs completed")
    prefect("deployment", "schedule", "clear", "pbt-benchmark/pbt-benchmark-rounds", "-y")
    assert all(r.auto_scheduled for r in runs)  # fired by the schedule, not by hand
    tune_runs = api(
        lambda c: c.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["tune"])),
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.COMPLETED]))
            ),
        )
    )
    said = sorted(
        (r.start_time, r.state.message or "")
        for r in tune_runs
        if r.parameters.get("name") == "pbt_benchmark_rounds"
    )
    messages = [m for _, m in said]
    assert "max_rounds=1 spent after round 1" in messages[0], messages
    assert messages[1].startswith("pbt_benchmark_rounds finished: 8 trials"), messages
    assert all(
        m == "pbt_benchmark_rounds had already finished: nothing to run" for m in messages[2:]
    )
    # one at a time: no run started before the one before it had ended
    spans = sorted((r.start_time, r.end_time) for r in runs)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans

    exp = Storage(storage).child("pbt_benchmark_rounds")
    assert read_experiment(exp.url) == read_experiment(uninterrupted_rounds(tmp_path / "ref"))


@pytest.mark.integration
def test_a_flow_run_that_keeps_failing_is_not_started_a_sixth_time(prefect_server):
    """Retries and crash re-runs end: from its 6th start on, popflow refuses the run (it
    ends Failed, which the re-run automation does not answer)."""
    from prefect import flow

    from popflow.flows.record.flow_retries import MAX_RUN_COUNT, refuse_crash_loop

    starts = []

    @flow(retries=MAX_RUN_COUNT + 1, retry_delay_seconds=0)
    def always_fails() -> None:
        refuse_crash_loop()
        starts.append(1)
        raise RuntimeError("boom")

    state = always_fails(return_state=True)
    assert state.is_failed()
    assert len(starts) == MAX_RUN_COUNT
    assert "TooManyRuns" in state.message and "has started 7 times" in state.message
