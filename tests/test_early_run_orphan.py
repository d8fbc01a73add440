"""An early flow run whose creation answered too late is not left Running beside the
engine's.

The record makes the ``tune`` flow run over plain HTTP, each request given
``early_run.TIMEOUT_S`` (2 s). A server that takes the run but answers later (a busy
SQLite database, a loaded machine) made the record fall back to Prefect's engine, which
made a second run; the first stayed Running for ever (run count 0, no rounds). Found by
the adversarial pass of issue 43 (item 1) with a proxy delaying the answer to
``POST /flow_runs/`` by 3 s: two ``d2`` runs, one Completed, one Running for ever.
FAILING FIRST (a real bug, no fix here): fails on the working tree of b042a18 plus the
uncommitted early run (flows/record/early_run.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from support.parity import parity_run
from support.prefect_api import tune_runs

from popflow.flows.record import early_run

pytestmark = pytest.mark.integration

NAME = "early-run-answered-late"


def test_a_flow_run_made_but_answered_too_late_is_not_left_running(tune_env, monkeypatch):
    call = early_run._call

    def answered_late(api_url: str, method: str, path: str, body: Any = None) -> Any:
        answer = call(api_url, method, path, body)
        if method == "POST" and path == "/flow_runs/":
            # the server made the run; its answer came after the client's timeout
            raise TimeoutError("timed out")
        return answer

    monkeypatch.setattr(early_run, "_call", answered_late)
    parity_run([10, 20], name=NAME, seed=0, verbose=0, **tune_env)
    runs = tune_runs(NAME)
    states = sorted(r.state.type.value for r in runs if r.state is not None)
    assert states == ["COMPLETED"], [(r.id, r.state) for r in runs]
