"""popflow's lines reach the Prefect API: a run's logs in the UI say what happened."""

from __future__ import annotations

import asyncio
from typing import Any

from trainables import Misbehaving

from popflow import run
from popflow.schedulers import FIFOScheduler


def run_logs(name: str) -> list[str]:
    """Every log line of the ``tune`` flow runs of experiment ``name``, in the API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        LogFilter,
        LogFilterFlowRunId,
    )

    async def call() -> list[str]:
        async with get_client() as client:
            runs = await client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=["tune"]))
            )
            ids = [r.id for r in runs if r.parameters.get("name") == name]
            logs = await client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=ids))
            )
        return [log.message for log in logs]

    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)  # what the run logged, shipped before it is read
    return asyncio.run(call())


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
