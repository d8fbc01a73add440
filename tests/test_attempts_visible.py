"""Every attempt of an experiment is visible in Prefect: a driver killed with SIGKILL shows
as a Crashed ``tune`` flow run with the rounds it committed, at their real times, whether
its record had caught up, lagged, or never started (issue 43, item 2).

The killed driver is tests/crash_driver.py (synchronous PBT, a round an iteration), killed
with its process group right after its third commit (round 2: the first is the
experiment's start, round 0); a second driver resumes it.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime
from typing import Any

import pytest
from conftest import free_port
from support.driving import drive
from support.polling import wait_for

pytestmark = pytest.mark.integration

ROUNDS = ["--iterations", "4"]


def tune_runs(name: str) -> list[Any]:
    """The experiment's ``tune`` flow runs, each with its task runs, by their first round."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterTags,
        TaskRunFilter,
        TaskRunFilterFlowRunId,
    )

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[f"experiment:{name}"]))
        )
        out = []
        for run in runs:
            tasks = client.read_task_runs(
                task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=[run.id]))
            )
            out.append((run, sorted(tasks, key=lambda t: (_started(t), t.name))))
    # in the order the attempts ran: a killed attempt's run may be written after the next's
    return sorted(out, key=lambda r: min([_started(t) for t in r[1]] or [r[0].created]))


def _started(task: Any) -> datetime:
    """When a task run started (a Pending one: when it was expected to)."""
    return task.start_time or task.expected_start_time


def seconds(at: datetime | None) -> float:
    assert at is not None
    return at.timestamp()


def kill_then_resume(tmp_path, name: str, first_env: dict | None = None) -> tuple[float, float]:
    """The killed driver's lifetime (start, end) after a resume ran to the end."""
    storage = str(tmp_path / "results")
    started = time.time()
    code = drive(storage, name, "pbt_synch", kill_at="commit-after:3", env=first_env, extra=ROUNDS)
    ended = time.time()
    assert code != 0, "the first driver was to be killed after round 2"
    drive(storage, name, "pbt_synch", extra=ROUNDS)
    return started, ended


def check_attempts(name: str, lifetime: tuple[float, float]) -> None:
    """Two attempts: the killed one Crashed with rounds 1-2 Completed inside its lifetime
    and before the resumed run began, and the round it was in Crashed; the resumed one
    Completed with rounds 3-4."""

    def both_recorded() -> Any:
        runs = tune_runs(name)
        if len(runs) < 2:
            return None
        done = [(t.name, t.state_type.value) for t in runs[0][1]]
        return runs if ("round-2", "COMPLETED") in done else None

    runs = wait_for(both_recorded, 60, "the killed attempt's rounds in Prefect")
    assert len(runs) == 2, [r.name for r, _ in runs]
    (killed, killed_rounds), (resumed, resumed_rounds) = runs
    assert killed.state_type.value == "CRASHED", killed.state
    assert killed.state_name == "Superseded"  # not the event the re-run automation answers
    assert "killed or stopped" in killed.state.message
    assert str(resumed.id) in killed.state.message  # who resumed it
    assert resumed.state_type.value == "COMPLETED", resumed.state
    assert killed.name == name and resumed.name == f"{name} · resumed after round 2"
    committed = [t for t in killed_rounds if t.state_type.value == "COMPLETED"]
    assert [t.name for t in committed] == ["round-1", "round-2"]
    born, died = lifetime
    for task in committed:
        start, end = seconds(task.start_time), seconds(task.end_time)
        assert born <= start <= end <= died, (task.name, start, end, lifetime)
        assert end <= seconds(resumed.start_time)
    crashed = [t for t in killed_rounds if t.state_type.value == "CRASHED"]
    assert [t.name for t in crashed] == ["round-3"], [(t.name, t.state_name) for t in killed_rounds]
    # ended when its driver was last seen, not when the next took over: the two attempts'
    # rounds do not overlap in the UI (before: round-3 ran on until the takeover)
    assert seconds(crashed[0].end_time) <= died, (crashed[0].end_time, lifetime)
    assert [t.name for t in resumed_rounds] == ["round-3", "round-4"]


def test_a_killed_attempt_is_crashed_with_its_committed_rounds(prefect_server, tmp_path):
    name = f"attempts-{uuid.uuid4().hex[:8]}"
    lifetime = kill_then_resume(tmp_path, name)
    check_attempts(name, lifetime)


def test_an_attempt_killed_before_its_record_started_gets_a_flow_run(prefect_server, tmp_path):
    name = f"unrecorded-{uuid.uuid4().hex[:8]}"
    nobody = f"http://127.0.0.1:{free_port()}/api"  # a server that is not up yet
    lifetime = kill_then_resume(tmp_path, name, first_env={"PREFECT_API_URL": nobody})
    check_attempts(name, lifetime)
    # the resume recorded it once: a second resume adds no run and no round
    before = [(r.id, [t.id for t in ts]) for r, ts in tune_runs(name)]
    drive(str(tmp_path / "results"), name, "pbt_synch", extra=ROUNDS)
    after = tune_runs(name)
    assert [(r.id, [t.id for t in ts]) for r, ts in after[:2]] == before
    assert len(after) == 3  # the third run: nothing to run


def test_a_resume_leaves_the_runs_of_a_same_named_experiment_elsewhere_alone(
    prefect_server, tmp_path
):
    """Two experiments of one name in different storage (``prefect.yaml``'s default name is
    ``experiment``). Before: the resume of one marked the other's killed run Superseded
    (the name alone chose the runs), and wrote its rounds into it."""
    name = f"twin-{uuid.uuid4().hex[:8]}"
    elsewhere = str(tmp_path / "elsewhere")
    code = drive(elsewhere, name, "pbt_synch", kill_at="commit-after:3", extra=ROUNDS)
    assert code != 0
    lifetime = kill_then_resume(tmp_path, name)

    def three() -> Any:
        runs = tune_runs(name)
        return runs if len(runs) == 3 else None

    runs = wait_for(three, 60, "three tune runs of the name")
    other = [
        (r, ts)
        for r, ts in runs
        if (r.parameters.get("spec") or {}).get("storage", "").startswith(elsewhere)
    ]
    assert len(other) == 1, [r.parameters.get("spec") for r, _ in runs]
    ((run, tasks),) = other
    assert run.state_type.value == "RUNNING", run.state  # killed, never resumed: as it was
    assert [t.name for t in tasks if t.state_type.value == "CRASHED"] == []
    assert lifetime[0] < lifetime[1]


def test_the_round_a_killed_attempt_was_in_ends_when_it_was_last_seen(prefect_server, tmp_path):
    """The killed driver's record had written the round it was in (Running in Prefect): the
    resume ends it Crashed at that driver's last sign of life (its lease's last renewal or
    its last commit), not at the takeover. Before, it ran on in the UI until the next driver
    took over, so two attempts were in the same round at once."""
    name = f"inflight-{uuid.uuid4().hex[:8]}"
    storage = str(tmp_path / "results")
    recorded = {"POPFLOW_TEST_KILL_RECORDED": name}  # the kill waits for a Running round
    assert drive(storage, name, "fifo", kill_at="commit-after:3", env=recorded) != 0
    died = time.time()
    drive(storage, name, "fifo")

    def both() -> Any:
        runs = tune_runs(name)
        if len(runs) < 2 or runs[0][0].state_type.value != "CRASHED":
            return None
        # a task run's states are events the server applies in the background
        tasks = runs[0][1] + runs[1][1]
        return runs if all(t.start_time and t.end_time for t in tasks) else None

    (_, killed_rounds), (_, resumed_rounds) = wait_for(both, 60, "two attempts")
    shown = [(t.name, t.state_name) for t in killed_rounds]
    # a round its record had begun but storage says committed is Completed (the record
    # lagged); the one it was in Crashed: before, every round left Running was Crashed
    assert [t.state_name for t in killed_rounds[:-1]] == ["Completed"] * (len(shown) - 1), shown
    crashed = killed_rounds[-1]
    assert crashed.state_name == "Superseded" and "last seen" in crashed.state.message, shown
    assert seconds(crashed.end_time) <= died, (crashed.end_time, died)
    first_resumed = min(seconds(t.start_time) for t in resumed_rounds)
    for task in killed_rounds:  # the two attempts do not overlap
        assert seconds(task.end_time) <= first_resumed, (task.name, task.end_time)
