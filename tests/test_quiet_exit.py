"""A run that went well ends quietly, also on a loaded machine: the embedded cluster's
workers are given the time they need to exit (not killed after Dask's 4 s), and the
Prefect record's events are sent without Prefect's "Still processing items" note."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from support.scripts import embedded_env

pytestmark = pytest.mark.system


@contextmanager
def busy_cores(n: int = 2) -> Iterator[None]:
    """``n`` Python processes spinning (a ``stress``-like load on a 2-core machine) while
    within; ended by their own PIDs."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()


#: A worker that takes longer than Dask's 4 s to close once asked to (a plugin or library
#: flushing as it closes, or a loaded machine): a plugin whose teardown takes 6 s.
SLOW_EXIT = textwrap.dedent(
    """
    import time

    from distributed.diagnostics.plugin import WorkerPlugin

    from popflow.infra.cluster.dask_cluster import dask_client


    class SlowTeardown(WorkerPlugin):
        def teardown(self, worker):
            time.sleep(6)


    with dask_client(n_workers=1) as client:
        client.register_plugin(SlowTeardown())
        print(client.submit(sum, [1, 2]).result())
    print("closed")
    """
)


def test_an_idle_worker_is_given_the_time_it_needs_to_exit_under_load(tmp_path):
    (tmp_path / "slow_exit.py").write_text(SLOW_EXIT)
    env = embedded_env(tmp_path / "prefect-home")
    with busy_cores():
        proc = subprocess.run(
            [sys.executable, "slow_exit.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert proc.stdout.split() == ["3", "closed"], out
    assert "still alive" not in out and "killing" not in out and "distributed" not in out, out


def test_the_records_events_are_sent_without_prefects_progress_note(prefect_server, caplog):
    """Many events queued when the run ends (a loaded machine's): all sent, and Prefect's
    "Still processing items: N items remaining..." is not printed while popflow waits."""
    from prefect.events import emit_event
    from prefect.events.worker import EventsWorker

    from popflow.flows.record.prefect_flow import _send_events

    caplog.set_level(logging.INFO)
    for i in range(500):
        emit_event(event="popflow.test.event", resource={"prefect.resource.id": f"test.{i}"})
    with busy_cores():
        _send_events()
    assert all(w._stopped for w in EventsWorker._instances.values())
    lines = [r.getMessage() for r in caplog.records]
    assert not [line for line in lines if "Still processing" in line], lines
    assert not [line for line in lines if "not sent" in line], lines


#: A call proxied through the embedded scheduler to a worker that dies during it.
DYING_WORKER = textwrap.dedent(
    """
    import os

    from popflow.infra.cluster.dask_cluster import dask_client

    with dask_client(n_workers=1) as client:
        try:
            client.run(os._exit, 3)
        except Exception as e:
            print("the call failed:", type(e).__name__)
    """
)


def test_a_dead_workers_failed_call_is_not_an_error_line_from_dask(tmp_path):
    """popflow says a dead worker once (its runner pool); the embedded scheduler's
    ``distributed.scheduler - ERROR - broadcast to ... failed`` is not printed."""
    (tmp_path / "dying.py").write_text(DYING_WORKER)
    env = embedded_env(tmp_path / "prefect-home")
    proc = subprocess.run(
        [sys.executable, "dying.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert "the call failed" in proc.stdout, out
    assert "broadcast to" not in out and "ERROR" not in out, out


#: A user's own flow that calls popflow.run: spawn imports this script in each worker
#: process, and with it Prefect, whose logging set-up prints through the root logger.
PARENT_FLOW = textwrap.dedent(
    """
    from prefect import flow

    from popflow import report, run


    def train(config):
        for i in range(3):
            report({"score": i * config["x"]})


    @flow(name="nightly")
    def nightly():
        grid = run(train, {"x": 2}, metric="score", mode="max", storage="results",
                   name="inside-a-flow", verbose=1)
        return grid.get_best_result().metrics["score"]


    if __name__ == "__main__":
        print("best", nightly())
    """
)


def test_a_run_inside_a_users_flow_prints_none_of_dasks_info_lines(prefect_server, tmp_path):
    """Before: ~20 ``distributed.worker`` / ``distributed.preloading`` INFO lines per worker
    ("Start worker at", "Registered to", ...) in Prefect's format, around the results."""
    script = tmp_path / "nightly.py"
    script.write_text(PARENT_FLOW)
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    said = out.stdout + out.stderr
    assert out.returncode == 0, said[-3000:]
    assert "best 4" in said
    assert "inside-a-flow finished" in said
    dask_lines = [line for line in said.splitlines() if "distributed." in line]
    assert not dask_lines, dask_lines[:10]
