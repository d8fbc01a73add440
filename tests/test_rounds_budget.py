"""A run a budget at a time: ``max_rounds`` ends a run resumably, each ``resume="auto"``
run advances the experiment by its rounds, and the end equals an uninterrupted run's;
name templates start a fresh experiment per day or flow run; the flow run's final
state says how the run ended."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.sorting import FlowRunSort
from support.driving import read_experiment
from trainables import ParityTrainable

from popflow import run
from popflow.flows.spec.run_spec import expand_name
from popflow.schedulers import PopulationBasedTraining, sample_from
from popflow.tune import CheckpointConfig

pytestmark = pytest.mark.integration


def synch_pbt_run(storage: str, **kwargs):
    values = iter([10, 20, 40, 30])
    return run(
        ParityTrainable,
        {"a": sample_from(lambda _: next(values)), "c": 1},
        scheduler=PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=2,
            hyperparam_mutations={"c": [1, 2, 3]},
            synch=True,
        ),
        metric="mean_accuracy",
        mode="max",
        num_samples=4,
        stop={"training_iteration": 12},
        checkpoint_config=CheckpointConfig(checkpoint_frequency=2),
        storage=storage,
        name="rounds",
        seed=0,
        **kwargs,
    )


def test_max_rounds_advances_the_experiment_a_budget_at_a_time(tune_env):
    storage = tune_env["storage"]
    dask = {"dask_address": tune_env["dask_address"]}
    runs, grid = 0, None
    while grid is None or {r.status for r in grid} != {"TERMINATED"}:
        grid = synch_pbt_run(storage, max_rounds=2, resume="auto", **dask)
        runs += 1
        done = {r.metrics.get("training_iteration", 0) for r in grid}
        assert max(done) <= 2 * 2 * runs  # 2 rounds of 2 iterations per run, at most
        assert runs < 10
    assert runs == 3  # 6 rounds of 2 iterations: 12
    reference = synch_pbt_run(f"{storage}-ref", **dask)
    path = grid.experiment_path
    assert read_experiment(path) == read_experiment(reference.experiment_path)
    with pytest.raises(ValueError, match="`max_rounds` is 0"):
        synch_pbt_run(storage, max_rounds=0, **dask)


def test_the_flow_runs_final_state_says_how_the_run_ended(tune_env):
    dask = {"dask_address": tune_env["dask_address"]}

    @flow
    def nightly(storage: str) -> str:
        synch_pbt_run(storage, max_rounds=5, resume="auto", **dask)
        from prefect.runtime import flow_run

        return str(flow_run.id)

    async def tune_messages() -> list[str]:
        async with get_client() as client:
            runs = await client.read_flow_runs(sort=FlowRunSort.EXPECTED_START_TIME_DESC)
        return [r.state.message or "" for r in runs if r.name and r.state]

    storage = tune_env["storage"]
    nightly(storage)  # 5 of 6 rounds
    nightly(storage)  # the last
    nightly(storage)  # nothing to do
    messages = asyncio.run(tune_messages())
    assert any("max_rounds=5 spent after round 5; 4 trials to go" in m for m in messages)
    assert any(m == "rounds finished: 4 trials, 0 errors" for m in messages)
    assert any(m == "rounds had already finished: nothing to run" for m in messages)


def test_a_name_template_makes_a_fresh_experiment_per_day_or_flow_run(tune_env):
    today = time.strftime("%Y-%m-%d", time.gmtime())
    assert expand_name("pbt_{date}") == f"pbt_{today}"
    assert expand_name("plain") == "plain"
    with pytest.raises(ValueError, match=r"may only use \{date\}, \{time\}"):
        expand_name("pbt_{day}")
    with pytest.raises(ValueError, match="need a Prefect flow run"):
        expand_name("pbt_{flow_run_name}")
    with pytest.raises(ValueError, match="must be a folder name"):
        expand_name("{date}/../x")

    @flow(flow_run_name="night-{storage_tag}")
    def nightly(storage: str, storage_tag: str) -> str:
        return run(
            ParityTrainable,
            {"a": 1},
            stop={"training_iteration": 1},
            storage=storage,
            name="pbt_{flow_run_name}",
            dask_address=tune_env["dask_address"],
        ).experiment_path

    path = nightly(tune_env["storage"], "one")
    assert os.path.basename(path) == "pbt_night-one"
