"""What the Prefect UI shows of a run, read back from a real server's API: popflow's log
lines in the run's logs, and its artifacts (leaderboard, progress, summary)."""

from __future__ import annotations

from typing import Any

import pytest
from support.parity import parity_run
from support.prefect_api import artifacts, run_logs, tune_runs
from trainables import Misbehaving

from popflow import run
from popflow.schedulers import FIFOScheduler

pytestmark = pytest.mark.integration

pytestmark = pytest.mark.integration


def test_a_runs_start_rounds_trial_errors_and_end_are_in_its_prefect_logs(tune_env):
    config: dict[str, Any] = {"a": 1, "how": "fail", "at": 2}
    grid = run(
        Misbehaving,
        config,
        scheduler=FIFOScheduler(),
        num_samples=2,
        stop={"training_iteration": 3},
        name="logged",
        **tune_env,
    )
    assert grid.num_errors == 2
    said = run_logs("logged")
    assert any(m.startswith("logged: 2 trials; results in ") for m in said), said
    assert any(m.startswith("round 1 committed: ") for m in said), said
    errors = [m for m in said if " errored: " in m]
    assert len(errors) == 2, said
    assert all(m.endswith("errored: RuntimeError: deterministic failure") for m in errors)
    assert any(m.startswith("logged finished: 2 trials, 2 errors") for m in said), said


def test_each_round_versions_the_leaderboard_and_the_end_writes_a_summary(tune_env):
    import json

    grid = parity_run(
        [10, 20, 40],
        name="Shown_PBT",
        seed=0,
        **tune_env,
    )
    boards = artifacts("shown-pbt-leaderboard")
    # a version per round, or the newest of the rounds a record behind the training missed
    assert 1 <= len(boards) <= 3, boards
    rows = json.loads(boards[-1].data) if isinstance(boards[-1].data, str) else boards[-1].data
    assert [r["trial"] for r in rows] == [r.trial_id for r in grid]  # all equal: in order
    assert {r["status"] for r in rows} == {"finished"}
    assert [r["iter"] for r in rows] == ["3", "3", "3"]
    assert [r["mean_accuracy"] for r in rows] == ["43", "43", "43"]
    assert all("c" not in r for r in rows)  # the same for all: no column
    (progress,) = artifacts("shown-pbt-progress")  # one artifact, updated in place
    assert progress.data == 100.0
    (summary,) = artifacts("shown-pbt-summary")
    text = summary.data
    assert text.startswith("# Shown_PBT finished: 3 trials, 0 errors")
    assert "**Best mean_accuracy**: 43" in text and "**Checkpoint**: `" in text
    assert f"popflow plot {grid.experiment_path}" in text
    # each exploit once in the run's logs, in Ray's words, as pbt_global.txt has it
    said = run_logs("Shown_PBT")
    clones = [m for m in said if m.startswith("[PopulationBasedTraining] [Exploit] Cloning trial")]
    with open(f"{grid.experiment_path}/pbt_global.txt") as f:
        policy = f.read().splitlines()
    assert clones and len(clones) == len(policy), (clones, policy)
    assert all("\n[PopulationBasedTraining] [Explore] Perturbed" in m for m in clones)


def round_task_names(name: str) -> list[str]:
    """The names of the task runs of experiment ``name``'s ``tune`` flow run, in order."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import TaskRunSort

    async def names(client: Any, ids: list[Any]) -> list[str]:
        tasks = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)),
            sort=TaskRunSort.EXPECTED_START_TIME_ASC,
        )
        return [t.name for t in tasks]

    return tune_runs(name, names)


def test_the_flow_runs_parameters_read_as_the_run_was_asked_for(tune_env):
    """Not ``"<RunSpec>"``: the trainable by import path, the storage URL, the scheduler
    with its arguments, num_samples, stop; the round task runs named by their round."""
    grid = parity_run(
        [10, 20],
        iterations=2,
        name="readable",
        seed=5,
        **tune_env,
    )
    (params,) = [r.parameters for r in tune_runs("readable")]
    assert round_task_names("readable") == ["round-1", "round-2"]
    spec = params["spec"]
    assert spec["trainable"] == "trainables:ParityTrainable"
    assert spec["storage"] == grid.experiment_path
    assert spec["scheduler"]["class"] == "PopulationBasedTraining"
    assert spec["scheduler"]["perturbation_interval"] == 1
    assert spec["scheduler"]["synch"] is True
    assert spec["scheduler"]["time_attr"] == "training_iteration"
    assert (spec["num_samples"], spec["stop"], spec["seed"]) == (2, {"training_iteration": 2}, 5)
    assert (spec["metric"], spec["mode"]) == ("mean_accuracy", "max")
    assert params["cluster"] == {"cluster": tune_env["dask_address"].scheduler.address}
