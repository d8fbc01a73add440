"""A flow run made early on the wrong server, then withdrawn: the run Prefect's settings
name still starts before the first round.

The record guesses its server before Prefect's import (``PREFECT_API_URL`` in the
environment, else popflow's local server of ``PREFECT_HOME``) and lets the first round
begin as soon as its early run is made. Where Prefect's settings name another server (a
profile, a ``.env``, a ``prefect.toml``) the early run is deleted and the engine makes its
own, after the round began: its start time is after the first round's and its log says
"no Prefect server answered yet: it was starting", though it answered all along. Found
by the adversarial pass of issue 43 (item 1) with a profile naming server B while the
local server A ran: round-1 began 0.93 s before the flow run on B. Issue 43: "when a
Prefect server is already reachable, the flow run is Running before its first round".
FAILING FIRST (a real bug, no fix here): fails on the working tree of b042a18 plus the
uncommitted early run (flows/record/early_run.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from support.parity import sleepy_run
from support.prefect_api import api, tune_runs

from popflow.infra import local_server

pytestmark = pytest.mark.integration

NAME = "early-run-withdrawn"


def test_the_run_prefect_names_starts_before_the_first_round(tune_env, tmp_path, monkeypatch):
    # popflow's local server of this PREFECT_HOME answers (the early guess); Prefect's
    # settings name the session's server (as a profile would): the record reports there
    home = tmp_path / "home"
    monkeypatch.setenv("PREFECT_HOME", str(home))
    monkeypatch.delenv("PREFECT_API_URL")
    local = local_server.local_server(home)  # stopped by conftest's _stop_local_servers
    sleepy_run(NAME, 0.2, seed=0, verbose=0, **tune_env)

    (flow_run,) = tune_runs(NAME)

    async def rounds(client: Any) -> list[Any]:
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

        return await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id]))
        )

    starts = [t.start_time for t in api(rounds) if t.name.startswith("round-")]
    assert starts, "no round task runs"
    assert flow_run.start_time is not None
    assert flow_run.start_time <= min(starts), (flow_run.start_time, min(starts))
    assert local.answers()  # the guess was a live server: only the run's place was wrong
