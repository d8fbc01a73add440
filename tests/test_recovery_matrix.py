"""Crash recovery works every time (issue 43): on one real Prefect server with its services,
one real ``prefect worker`` on a process pool and ``automations.yaml``'s re-run automations,
the ``experiment`` deployment's seeded synchronous PBT run is SIGKILLed

- (a) in its first attempt, after round 2 is committed;
- (b) in Prefect's in-process retry of a first attempt that failed (its lease was held);
- (c) in the automation's re-run, as that re-run resumes (it has just taken the lease);
- (d) twice in a row after round 2 (the re-run killed where the first attempt was).

Each ends Completed with the same experiment (every trial's results, configs and the
PBT log) as an uninterrupted run of the deployment with the same seed, run beside them.
Each has one start per attempt and one Crashed state per kill. Before the fix, (b) stayed
Scheduled: the killed retry left ``retry_type="in_process"``, which workers' query skips,
and the forced re-run kept it; and a re-run scheduled 10 s after the first of the process
worker's two crash reports was marked Crashed by the second (up to 30 s later here) as it
started, and was re-run beside itself.

The cases run at once, each a list of steps (wait for a condition, then act) advanced by
one polling loop, so the matrix takes as long as its slowest case. Each case's experiment
has a name of its own (and so trial ids of its own, written alike when compared).

The flows' own half of the fix: a retry, once it runs, clears that mark (a forced re-run
after a crash in it is picked up too)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from recovery_trainables import GATE_ENV
from support.driving import read_experiment
from support.lease_holder import hold_lease
from support.polling import wait_for
from support.prefect_api import api
from test_deployment import prefect
from test_recovery import services_server, unfinished_runs

from popflow.flows.experiment.new_trials import trial_id_of
from popflow.flows.spec import storage_roots
from popflow.flows.spec.trainable_paths import ALLOWLIST_ENV
from popflow.infra.storage.folder import Storage
from popflow.infra.store.lease import lease_holder

__all__ = ["services_server"]  # the fixture: one server with its services and a worker

#: Seconds each step of a case may wait for its condition (a loaded machine is slow).
STEP_DEADLINE_S = 240.0
#: Seconds a Scheduled run may stay past its start time before it counts as stuck: the
#: worker looks every second (the bug: it never took the run).
STUCK_S = 60.0
#: The trials stop at this iteration while their case's gate is shut: round 3 (PBT's
#: perturbation interval is 2), after rounds 1 and 2 are committed.
GATE_AT = 5


def params(storage: str, name: str) -> dict[str, Any]:
    """Synchronous PBT of EnvGatedTrainable, seeded, as the ``experiment`` deployment's
    JSON parameters."""
    return {
        "trainable": "recovery_trainables:EnvGatedTrainable",
        "param_space": {"a": {"uniform": [0, 1]}, "gate_at": GATE_AT},
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
        "name": name,
        "seed": 3,
        "plots": False,
    }


@dataclass
class Step:
    what: str
    #: of the case and its flow run as read this poll: truthy once the step may act
    ready: Callable[[Case, Any], Any]
    #: what it does then, given what ``ready`` returned
    act: Callable[[Case, Any], None] = lambda case, found: None


@dataclass
class Case:
    name: str
    kill_points: str
    steps: list[Step]
    run_count: int  # the flow run's starts: its first attempt, retries and re-runs
    states: list[str]  # state names its history must hold, in this order
    folder: Path = Path()
    gated: bool = True
    run_id: UUID | None = None
    killed: list[int] = field(default_factory=list)
    holder: subprocess.Popen | None = None  # a process holding the experiment's lease
    at: int = 0
    step_since: float = 0.0
    started: float = 0.0
    wall_s: float | None = None
    run: Any = None

    @property
    def storage(self) -> str:
        return str(self.folder / "results")

    @property
    def experiment_name(self) -> str:
        # one name per case: a re-run marks every other Running `tune` run of its
        # experiment's name Superseded (stale_runs), whatever storage that run writes
        return f"recovered_{self.name}"

    @property
    def experiment(self) -> str:
        return str(self.folder / "results" / self.experiment_name)

    @property
    def gate(self) -> Path:
        return self.folder / "gate"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def new_driver(case: Case, run: Any = None) -> int | None:
    """The pid of the driver holding the experiment's lease, if it is alive and not one
    this test killed or planted: the flow run's present attempt, once it has opened the
    experiment."""
    held = lease_holder(Storage(case.experiment))
    pid = held.get("pid") if held else None
    if not isinstance(pid, int) or pid in case.killed:
        return None
    if case.holder is not None and pid == case.holder.pid:
        return None
    return pid if alive(pid) else None


def at_gate(case: Case, run: Any = None) -> int | None:
    """The present attempt's driver, once a trial of it waits at the gate."""
    return new_driver(case) if (case.gate / "reached").exists() else None


def kill(case: Case, pid: int) -> None:
    """SIGKILL the flow run's process (the driver, with its Dask cluster)."""
    os.kill(pid, signal.SIGKILL)
    case.killed.append(pid)
    (case.gate / "reached").unlink(missing_ok=True)  # the next attempt makes it again


def kill_and_open(case: Case, pid: int) -> None:
    kill(case, pid)
    (case.gate / "open").touch()  # the next attempt passes the gate


def named(state: str) -> Callable[[Case, Any], bool]:
    return lambda case, run: run is not None and run.state_name == state


def free_lease(case: Case, found: Any) -> None:
    """The holder of the experiment's lease goes: Prefect's retry can take it."""
    assert case.holder is not None
    case.holder.kill()
    case.holder.wait(timeout=30)


def ended(case: Case, run: Any) -> bool:
    return run is not None and run.state.type.value in ("COMPLETED", "FAILED", "CANCELLED")


END = Step("the flow run ended", ended)


def matrix() -> list[Case]:
    return [
        Case("none", "uninterrupted", [END], 1, ["Completed"], gated=False),
        Case(
            "a",
            "first attempt, after round 2",
            [Step("the first attempt at the gate", at_gate, kill_and_open), END],
            2,
            ["Running", "Crashed", "Rerun", "Running", "Completed"],
        ),
        Case(
            "b",
            "Prefect's in-process retry, after round 2",
            [
                Step(
                    "the first attempt failed: retried in process",
                    named("AwaitingRetry"),
                    free_lease,
                ),
                Step("the retry at the gate", at_gate, kill_and_open),
                END,
            ],
            3,
            ["Running", "AwaitingRetry", "Running", "Crashed", "Rerun", "Running", "Completed"],
        ),
        Case(
            "c",
            "first attempt after round 2, then the re-run as it resumes",
            [
                Step("the first attempt at the gate", at_gate, kill),
                Step("the re-run holding the lease", new_driver, kill_and_open),
                END,
            ],
            3,
            ["Crashed", "Rerun", "Running", "Crashed", "Rerun", "Running", "Completed"],
        ),
        Case(
            "d",
            "first attempt after round 2, then the re-run there too",
            [
                Step("the first attempt at the gate", at_gate, kill),
                Step("the re-run at the gate", at_gate, kill_and_open),
                END,
            ],
            3,
            ["Crashed", "Rerun", "Running", "Crashed", "Rerun", "Running", "Completed"],
        ),
    ]


def start(case: Case, deployment: UUID) -> None:
    """The case's flow run of the deployment, with its own storage and gate."""
    case.gate.mkdir(parents=True)
    env = {ALLOWLIST_ENV: "recovery_trainables", storage_roots.ALLOWLIST_ENV: case.storage}
    if case.gated:
        env[GATE_ENV] = str(case.gate)
    if case.name == "b":  # a live driver holds the lease: the first attempt fails
        case.holder = hold_lease(case.experiment)
        assert case.holder.stdout is not None and case.holder.stdout.readline() == "held\n"

    async def create(client: Any) -> UUID:
        run = await client.create_flow_run_from_deployment(
            deployment,
            parameters=params(case.storage, case.experiment_name),
            job_variables={"env": env},
        )
        return run.id

    case.run_id = api(create)
    case.started = case.step_since = time.monotonic()


def read_runs(ids: list[UUID]) -> dict[UUID, Any]:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    runs = api(
        lambda c: c.read_flow_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)))
    )
    return {r.id: r for r in runs}


def stuck_for(run: Any) -> float:
    """Seconds a Scheduled run has waited past its start time (0 for any other state)."""
    when = run.state.state_details.scheduled_time if run.state.is_scheduled() else None
    return (datetime.now(UTC) - when).total_seconds() if when is not None else 0.0


def advance(cases: list[Case]) -> bool:
    """One poll: each case's step acts once its condition holds; True when all ended."""
    runs = read_runs([c.run_id for c in cases if c.run_id is not None])
    for case in cases:
        if case.at == len(case.steps):
            continue
        run = case.run = runs.get(case.run_id)
        step = case.steps[case.at]
        if run is not None and stuck_for(run) > STUCK_S:
            raise AssertionError(
                f"case {case.name}: the flow run is {run.state_name} {stuck_for(run):.0f} s past "
                f"its start time (retry_type {run.empirical_policy.retry_type!r}); no worker "
                f"takes it (waiting for: {step.what})"
            )
        found = step.ready(case, run)
        if found:
            step.act(case, found)
            case.at += 1
            case.step_since = time.monotonic()
            if case.at == len(case.steps):
                case.wall_s = time.monotonic() - case.started
        elif time.monotonic() - case.step_since > STEP_DEADLINE_S:
            raise AssertionError(
                f"case {case.name}: {step.what}: not after {STEP_DEADLINE_S:.0f} s (the flow "
                f"run is {run.state_name if run else 'unread'})"
            )
    return all(c.at == len(c.steps) for c in cases)


def experiment_of(case: Case) -> str:
    """What the case's experiment holds (support.driving.read_experiment: the PBT log,
    every trial's results with their configs, final states), its trial ids' prefix and
    its name written alike for every case: they come from the experiment's name."""
    prefix = trial_id_of(case.experiment_name, 0).split("_")[0] + "_"
    held = json.dumps(read_experiment(case.experiment), sort_keys=True)
    return held.replace(prefix, "<trial>_").replace(case.experiment_name, "<experiment>")


def in_order(names: list[str], expected: list[str]) -> bool:
    """Whether ``expected`` is a subsequence of ``names``."""
    rest = iter(names)
    return all(name in rest for name in expected)


@pytest.mark.system
def test_every_kill_point_recovers_to_the_uninterrupted_experiment(services_server, tmp_path):
    prefect("--no-prompt", "deploy", "--name", "experiment")
    deployment = api(lambda c: c.read_deployment_by_name("popflow-experiment/experiment")).id
    cases = matrix()
    try:
        for case in cases:
            case.folder = tmp_path / case.name
            start(case, deployment)
        wait_for(
            lambda: advance(cases),
            STEP_DEADLINE_S * 4,
            "every case ended",
            interval_s=0.25,
        )
    finally:
        for case in cases:
            if case.holder is not None and case.holder.poll() is None:
                case.holder.kill()
                case.holder.wait(timeout=30)

    reference = experiment_of(cases[0])
    rows, failures = [], []
    for case in cases:
        run = case.run
        states = api(lambda c, case=case: c.read_flow_run_states(case.run_id))
        history = [s.name for s in sorted(states, key=lambda s: s.timestamp)]
        same = experiment_of(case) == reference
        rows.append(
            f"| {case.name} | {case.kill_points} | {run.state_name} | {'yes' if same else 'no'}"
            f" | {case.wall_s:.1f} s | {run.run_count} | {' > '.join(history)} |"
        )
        if run.state.type.value != "COMPLETED":
            failures.append(f"{case.name} ended {run.state_name}: {run.state.message}")
        if not same:
            failures.append(f"{case.name}: its experiment differs from the uninterrupted run's")
        crashes = history.count("Crashed")  # one per kill: no late report lands on a re-run
        if (
            run.run_count != case.run_count
            or crashes != len(case.killed)
            or not in_order(history, case.states)
        ):
            first = min(s.timestamp for s in states)
            told = [
                f"{(s.timestamp - first).total_seconds():.1f} s {s.name}: {s.message or ''}"[:160]
                for s in sorted(states, key=lambda s: s.timestamp)
            ]
            failures.append(f"{case.name}: {run.run_count} starts, states:\n" + "\n".join(told))
    print(
        "\n| case | killed | final state | identical | wall | starts | states |\n"
        "|---|---|---|---|---|---|---|\n" + "\n".join(rows)
    )
    assert not failures, "\n\n".join(failures)
    assert unfinished_runs() == []
    uninterrupted = read_experiment(cases[0].experiment)
    assert uninterrupted["status"] == ["TERMINATED"] * 4 and uninterrupted["checkpoints_ok"]


@pytest.mark.integration
def test_a_retry_once_running_leaves_its_flow_run_to_workers(prefect_server):
    """A deployed flow's in-process retry, once it runs, no longer bears Prefect's
    ``retry_type="in_process"``, which hides a Scheduled run from every worker: a forced
    re-run after a crash in that retry (``prefect flow-run retry``) is picked up too."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    from popflow.flows.record.flow_retries import mistakes_not_retried

    seen: list[str | None] = []

    @flow(retries=1, retry_delay_seconds=0)
    def fails_once() -> None:
        with mistakes_not_retried():
            context = FlowRunContext.get()
            assert context is not None and context.flow_run is not None
            with get_client(sync_client=True) as client:
                seen.append(client.read_flow_run(context.flow_run.id).empirical_policy.retry_type)
            if len(seen) == 1:
                raise RuntimeError("a failure a retry mends")

    state = fails_once(return_state=True)
    assert state.is_completed()
    assert seen == [None, None]  # Prefect's mark, "in_process", is gone as the retry runs
