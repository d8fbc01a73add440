"""popflow's Prefect events, end to end: a run emits ``popflow.round.committed``,
``popflow.trial.new-best``, ``popflow.trial.errored`` and ``popflow.experiment.finished``
about its experiment, related to its flow run; the shipped example automation
(examples/automations/notify_new_best.yaml), created on a real Prefect server, calls a
webhook (a local HTTP receiver the test starts) with the new best's metric."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from support.parity import parity_scheduler, parity_space
from support.polling import wait_for
from support.prefect_api import events, tune_runs
from trainables import ParityFailing

from popflow import run

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CREATE = os.path.join(ROOT, "examples", "automations", "notify_new_best.py")


@contextmanager
def receiver() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """An HTTP server on 127.0.0.1 that keeps each POST's JSON body: its URL and the bodies."""
    bodies: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            bodies.append(json.loads(body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/new-best", bodies
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_events_and_the_example_automation_call_a_webhook_on_a_new_best(tmp_path, tune_env):
    name = "events"
    experiment = f"popflow.experiment.{name}"
    with receiver() as (url, received):
        made = subprocess.run(
            [sys.executable, CREATE, url], capture_output=True, text=True, timeout=120
        )
        assert made.returncode == 0, made.stdout + made.stderr
        # trial 1 errors at its second iteration
        trainable = type("Parity", (ParityFailing,), {"fail_at": {1: 2}})
        grid = run(
            trainable,
            parity_space([10, 20, 40, 30]),
            scheduler=parity_scheduler(synch=True),
            metric="mean_accuracy",
            mode="max",
            num_samples=4,
            stop={"training_iteration": 3},
            storage=tune_env["storage"],
            name=name,
            seed=0,
            dask_address=tune_env["dask_address"],
        )
        best = grid.get_best_result()
        value = best.metrics["mean_accuracy"]
        wait_for(
            lambda: any(b.get("value") == value for b in received),
            120,
            f"the webhook called with the best metric {value}",
            interval_s=0.5,
        )
    call = next(b for b in received if b["value"] == value)
    assert call["experiment"] == name and call["metric"] == "mean_accuracy", call
    assert call["trial_id"] == best.trial_id and call["checkpoint"], call
    assert call["config"]["a"] == best.config["a"], call

    (flow_run,) = tune_runs(name)
    run_id = f"prefect.flow-run.{flow_run.id}"

    def emitted(event: str) -> list[Any]:
        return wait_for(lambda: events(event, experiment), 60, event, interval_s=0.5)

    committed = emitted("popflow.round.committed")
    last = max(committed, key=lambda e: e.payload["round"])
    # a round each from 1 (round 0's commit, the sampled population, is not a round)
    assert all(e.payload["round"] >= 1 for e in committed), [e.payload for e in committed]
    assert last.payload["best_metric"] == value, last.payload
    assert sum(last.payload["trials"].values()) == 4, last.payload
    new_best = emitted("popflow.trial.new-best")
    assert max(e.payload["value"] for e in new_best) == value
    errored = emitted("popflow.trial.errored")
    assert [e.payload["error"] for e in errored] == ["RuntimeError: boom at iteration 2"]
    (finished,) = emitted("popflow.experiment.finished")
    assert finished.payload["errors"] == 1 and finished.payload["best_metric"] == value
    for event in [last, *new_best, *errored, finished]:
        related = {r.id: r.role for r in event.related}
        assert related.get(run_id) == "flow-run", related
        assert any(r.startswith("prefect.flow.") for r in related), related
