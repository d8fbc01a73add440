"""The training does not wait for Prefect; Prefect's record of the run catches up.

``popflow.run`` trains in the calling thread and records the run as the ``tune``
flow run from a thread of its own (:mod:`popflow.flows.prefect_flow`); on the
embedded default it reports to popflow's local Prefect server, started by the
first run of a ``PREFECT_HOME`` and reused by the runs after it
(:mod:`popflow.infra.local_server`).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from test_prefect_ui import artifacts, run_logs, tune_runs
from test_resume import ListHandler
from test_tune_pbt import parity_scheduler, parity_space
from trainables import Misbehaving, ParityTrainable

from popflow import FIFOScheduler, grid_search, run
from popflow.flows import plot_artifacts
from popflow.flows.artifacts import RunArtifacts
from popflow.flows.plot_artifacts import PlotRefresh
from popflow.flows.run_feed import Line, RoundBegins, RoundDone, RunEnd, RunFeed
from popflow.infra import local_server
from popflow.schedulers import ASHAScheduler

ROOT = Path(__file__).resolve().parents[1]

#: A short run on the embedded default that prints the server it reported to.
SCRIPT = """
from popflow import report, run

def train(config):
    for i in range(3):
        report({"score": i * config["x"]})

grid = run(train, {"x": 2}, metric="score", mode="max", storage="results", name=NAME,
           verbose=1)
print("best", grid.get_best_result().metrics["score"])
"""


def test_the_feed_keeps_the_order_and_ends_with_the_run():
    feed = RunFeed()
    feed.line(logging.INFO, "start")
    feed.round_begins(1)
    feed.line(logging.ERROR, "trial t errored")
    feed.round_done(1, [Line(logging.INFO, "round 1 committed", detail=True)], [], 50.0)
    feed.end(RunEnd("done"))
    assert feed.training.is_set()  # the record's work starts at the latest at the end
    events = []
    while (event := feed.next()) is not None:
        events.append(event)
    assert [type(e) for e in events] == [Line, RoundBegins, Line, RoundDone, RunEnd]
    assert events[2].message == "trial t errored" and events[3].lines[0].detail
    assert feed.next() is None  # after the end: nothing more is waited for


def test_a_run_finishes_when_prefect_cannot_be_reached(monkeypatch, tmp_path, dask_cluster):
    """Storage is the truth: a Prefect API that does not answer costs the run its record,
    not its results (before, the run itself failed on it)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # nothing listens
    monkeypatch.setenv("PREFECT_CLIENT_MAX_RETRIES", "0")
    lines = ListHandler()  # on popflow's logger: Prefect's first import resets the root's
    logging.getLogger("popflow").addHandler(lines)
    try:
        with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
            grid = run(
                Misbehaving,
                {"a": 1, "how": "ok", "at": 99},
                scheduler=FIFOScheduler(),
                stop={"training_iteration": 2},
                storage=str(tmp_path / "results"),
                name="unrecorded",
                dask_address=dask_cluster,
            )
    finally:
        logging.getLogger("popflow").removeHandler(lines)
    assert grid.num_errors == 0 and len(grid) == 1
    assert grid[0].metrics["training_iteration"] == 2
    said = lines.lines
    assert any("the Prefect record of unrecorded is incomplete" in m for m in said), said


def test_a_training_error_fails_the_flow_run_and_reaches_the_caller(tune_env, monkeypatch):
    """The caller gets the training's own exception; the flow run ends Failed with it."""
    from popflow.flows import training

    def broken(*args, **kwargs):
        raise ValueError("the experiment cannot open")

    monkeypatch.setattr(training, "open_experiment", broken)
    with pytest.raises(ValueError, match="the experiment cannot open"):
        run(Misbehaving, {"a": 1, "how": "ok", "at": 99}, name="broken", **tune_env)
    (flow_run,) = tune_runs("broken")
    assert flow_run.state_name == "Failed"
    assert "ValueError: the experiment cannot open" in flow_run.state.message
    assert any("the training raised:" in m for m in run_logs("broken"))


def _script(tmp_path: Path, name: str, home: Path) -> subprocess.CompletedProcess:
    """``SCRIPT`` as a fresh process on the embedded default (no ``PREFECT_API_URL``)."""
    path = tmp_path / f"{name}.py"
    path.write_text(f"NAME = {name!r}\n" + textwrap.dedent(SCRIPT))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def test_the_first_run_starts_a_local_server_that_the_next_reuses_until_stopped(tmp_path):
    home = tmp_path / "prefect-home"
    first = _script(tmp_path, "first", home)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    server = local_server.running(home)
    assert server is not None  # it outlived the script
    second = _script(tmp_path, "second", home)
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    assert "best 4" in first.stdout and "best 4" in second.stdout
    assert local_server.running(home) == server  # the same process: reused, not restarted
    for out in (first.stdout + first.stderr, second.stdout + second.stderr):
        assert f"Prefect UI: {server.ui_url}" in out
        assert "Starting temporary server" not in out

    # both runs are in its API, finished
    body = json.dumps({"flows": {"name": {"any_": ["tune"]}}}).encode()
    request = urllib.request.Request(
        f"{server.api_url}/flow_runs/filter", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        runs = json.load(r)
    assert sorted((f["parameters"]["name"], f["state_name"]) for f in runs) == [
        ("first", "Completed"),
        ("second", "Completed"),
    ]

    stopped = subprocess.run(
        [sys.executable, "-m", "popflow.flows.cli", "server", "stop"],
        env={**os.environ, "PREFECT_HOME": str(home)}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert stopped.returncode == 0 and f"pid {server.pid}" in stopped.stdout
    assert local_server.running(home) is None and not local_server._alive(server.pid)


def test_two_scripts_starting_at_once_start_one_server(tmp_path):
    home = tmp_path / "prefect-home"
    procs = []
    for name in ("left", "right"):
        path = tmp_path / f"{name}.py"
        path.write_text(f"NAME = {name!r}\n" + textwrap.dedent(SCRIPT))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env["PREFECT_HOME"] = str(home)
        procs.append(subprocess.Popen(
            [sys.executable, str(path)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        ))  # fmt: skip
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    server = local_server.running(home)
    assert server is not None
    servers = subprocess.run(["pgrep", "-f", "prefect server start"], capture_output=True,
                             text=True).stdout.split()  # fmt: skip
    ours = [pid for pid in servers if Path(f"/proc/{pid}/environ").exists()
            and str(home).encode() in Path(f"/proc/{pid}/environ").read_bytes()]  # fmt: skip
    assert ours == [str(server.pid)]
    assert all(f"Prefect UI: {server.ui_url}" in out for out in outs)


def _events(name: str, resource_id: str) -> list[Any]:
    """The events named ``name`` about the resource ``resource_id``, in the API."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    with get_client(sync_client=True) as client:
        page = client.read_events(
            filter=EventFilter(
                event=EventNameFilter(name=[name]),
                resource=EventResourceFilter(id=[resource_id]),
            ),
            limit=50,
        )
    return page.events


def test_the_flow_run_heartbeats_once_per_interval_and_its_end_does_not_wait(tune_env):
    """The ``tune`` run's heartbeats (what a zombie-run automation watches) are popflow's:
    one at its start and one per interval after, as Prefect's engine sends them. Prefect's
    own are off for it: they came from a thread the run's end waited 0.5-1 s for, and
    both would have been sent at the start."""
    from prefect.events.worker import EventsWorker

    from popflow.flows.flow_heartbeat import EVENT

    run(
        Misbehaving,
        {"a": 1, "how": "ok", "at": 99},
        stop={"training_iteration": 2},
        name="heartbeats",
        **tune_env,
    )
    (flow_run,) = tune_runs("heartbeats")
    assert flow_run.state_name == "Completed"
    resource_id = f"prefect.flow-run.{flow_run.id}"
    EventsWorker.drain_all(timeout=10)
    deadline = time.monotonic() + 60  # the server persists events every few seconds
    beats: list[Any] = []
    while time.monotonic() < deadline:
        beats = _events(EVENT, resource_id)
        if beats and _events("prefect.flow-run.Completed", resource_id):
            break
        time.sleep(0.5)
    assert len(beats) == 1, beats  # the default interval (180 s) outlasts this run
    (beat,) = beats
    assert beat.resource["prefect.resource.name"] == flow_run.name
    roles = {r.role: r.id for r in beat.related}
    assert roles["flow"] == f"prefect.flow.{flow_run.flow_id}"


def test_the_leaderboard_reads_like_the_console_and_tells_stopped_early_from_finished(tune_env):
    """ASHA: a column per hyperparameter, the console's rounding, a time column, trials
    stopped at a rung apart from those that finished; the summary counts them (no
    exploits column); the progress says trials ended and the best so far."""
    run(
        ParityTrainable,
        {"a": grid_search([4, 3, 2, 1]), "lr": grid_search([0.001])},
        scheduler=ASHAScheduler(grace_period=1, reduction_factor=2, max_t=4),
        metric="mean_accuracy",
        mode="max",
        stop={"training_iteration": 4},
        max_concurrent_trials=1,  # the best first: the others meet its results at the rungs
        name="board",
        **tune_env,
    )
    rows = artifacts("board-leaderboard")[-1].data
    rows = json.loads(rows) if isinstance(rows, str) else rows
    assert list(rows[0]) == ["trial", "status", "mean_accuracy", "iter", "total time (s)", "a"]
    assert rows[0]["a"] == "4" and sorted(r["a"] for r in rows) == ["1", "2", "3", "4"]
    ends: dict[str, set[int]] = {"finished": set(), "stopped early": set()}
    for r in rows:
        ends[r["status"]].add(int(r["iter"]))
    assert ends["finished"] == {4}, rows  # as far as any trial got
    assert ends["stopped early"] and max(ends["stopped early"]) < 4, rows  # at a rung
    assert all(float(r["total time (s)"]) >= 0 for r in rows)
    (summary,) = artifacts("board-summary")
    assert "stopped early" in summary.data and "exploits" not in summary.data
    (progress,) = artifacts("board-progress")
    assert "4 of 4 trials ended; best mean_accuracy 8 (trial " in progress.description


def test_a_round_never_waits_for_the_plots(prefect_server):
    """The plots are drawn on a thread of their own: while a drawing hangs, each round's
    leaderboard is sent and a round's call returns; no second drawing starts meanwhile."""
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def draw(experiment: str, path: str, options: Any) -> bool:
        calls.append(path)
        started.set()
        release.wait(60)
        return True

    refresh = PlotRefresh("hung", "/nowhere", None, interval_s=0.0, draw=draw)
    board = RunArtifacts("hung", "score", "max", plots=refresh)
    for round_no in (1, 2, 3):
        board.round_rows([{"trial": "t", "score": str(round_no)}], 50.0, round_no, "")
    assert started.wait(30)
    board.flush()  # the rounds' artifacts reach Prefect with the drawing still hung
    assert len(artifacts("hung-leaderboard")) == 3 and calls == ["/nowhere"]
    release.set()
    board.final_text("# done", "done")  # the last drawing, once one was drawn
    assert refresh.drawn == 2 and len(calls) == 2


def test_a_long_enough_run_redraws_its_plots_while_it_goes(tune_env, monkeypatch):
    monkeypatch.setattr(plot_artifacts, "PLOTS_INTERVAL_S", 0.0)  # every round may draw
    run(
        ParityTrainable,
        parity_space([10, 20, 40]),
        scheduler=parity_scheduler(synch=True),
        metric="mean_accuracy",
        mode="max",
        num_samples=3,
        stop={"training_iteration": 4},
        name="live-plots",
        **tune_env,
    )
    versions = artifacts("live-plots-plots")
    assert len(versions) >= 2, versions  # while it ran, and its end
    assert all("data:image/png;base64," in v.data for v in versions)
    assert "as of round 4" in versions[-1].description
