"""The training does not wait for Prefect; Prefect's record of the run catches up.

``popflow.run`` trains in the calling thread and records the run as the ``tune``
flow run from a thread of its own (:mod:`popflow.flows.record.prefect_flow`); on the
embedded default it reports to popflow's local Prefect server, started by the
first run of a ``PREFECT_HOME`` and reused by the runs after it
(:mod:`popflow.infra.local_server`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.browser import rendered_text
from support.parity import parity_run, sleepy_run
from support.polling import wait_for
from support.prefect_api import artifacts, events, run_logs, tune_runs
from support.scripts import embedded_env
from test_resume import ListHandler
from trainables import Misbehaving, ParityTrainable

from popflow import FIFOScheduler, grid_search, run
from popflow.flows.api import training
from popflow.flows.record import plot_artifacts, prefect_flow, round_runs, run_feed
from popflow.flows.record.artifacts import RunArtifacts
from popflow.flows.record.plot_artifacts import PlotRefresh
from popflow.flows.record.run_feed import Line, RoundBegins, RoundDone, RunEnd, RunFeed
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


@pytest.mark.unit
def test_the_feed_keeps_the_order_and_ends_with_the_run():
    feed = RunFeed()
    feed.line(logging.INFO, "start")
    feed.round_begins(1)
    feed.line(logging.ERROR, "trial t errored")
    feed.round_done(1, [Line(logging.INFO, "round 1 committed", detail=True)], [], 50.0)
    feed.end(RunEnd("done"))
    assert feed.titled.is_set()  # the record's flow run is named at the latest at the end
    events = []
    while (event := feed.next()) is not None:
        events.append(event)
    assert [type(e) for e in events] == [Line, RoundBegins, Line, RoundDone, RunEnd]
    assert events[2].message == "trial t errored" and events[3].lines[0].detail
    assert feed.next() is None  # after the end: nothing more is waited for


@pytest.mark.integration
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


@pytest.mark.integration
def test_a_training_error_fails_the_flow_run_and_reaches_the_caller(tune_env, monkeypatch):
    """The caller gets the training's own exception; the flow run ends Failed with it."""
    from popflow.flows.api import training

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
    env = embedded_env(str(home))
    return subprocess.run(
        [sys.executable, str(path)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


@pytest.mark.system
def test_the_first_run_starts_a_local_server_that_the_next_reuses_until_stopped(tmp_path):
    """Its UI, rendered in Chromium as a person opens the address the run printed, calls
    its own API and lists the runs by their experiments' names (before, it called port
    4200 and said "Can't connect to Server API")."""
    home = tmp_path / "prefect-home"
    first = _script(tmp_path, "first-of-two", home)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    server = local_server.running(home)
    assert server is not None  # it outlived the script
    second = _script(tmp_path, "second-of-two", home)
    assert second.returncode == 0, (second.stdout + second.stderr)[-3000:]
    assert "best 4" in first.stdout and "best 4" in second.stdout
    assert local_server.running(home) == server  # the same process: reused, not restarted
    for out in (first.stdout + first.stderr, second.stdout + second.stderr):
        assert f"Prefect UI: {server.ui_url}" in out
        assert "Starting temporary server" not in out

    # both runs are in its API, finished, named and tagged by their experiments
    body = json.dumps({"flows": {"name": {"any_": ["tune"]}}}).encode()
    request = urllib.request.Request(
        f"{server.api_url}/flow_runs/filter", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        runs = json.load(r)
    assert sorted((f["name"], f["parameters"]["name"], f["state_name"]) for f in runs) == [
        ("first-of-two", "first-of-two", "Completed"),
        ("second-of-two", "second-of-two", "Completed"),
    ]
    assert all({"popflow", f"experiment:{f['name']}", "scheduler:FIFOScheduler"}
               <= set(f["tags"]) for f in runs)  # fmt: skip

    # what a person sees: the printed address, then the runs list (Prefect 3.9's default UI)
    assert server.ui_api_url() == server.api_url
    dashboard = rendered_text(server.ui_url)
    assert "Dashboard" in dashboard and "Can't connect" not in dashboard, dashboard
    listed = rendered_text(f"{server.ui_url}/v2/runs")
    assert "tune / first-of-two" in listed and "tune / second-of-two" in listed, listed

    stopped = subprocess.run(
        [sys.executable, "-m", "popflow.flows.api.cli", "server", "stop"],
        env={**os.environ, "PREFECT_HOME": str(home)}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert stopped.returncode == 0 and f"pid {server.pid}" in stopped.stdout
    assert local_server.running(home) is None and not local_server._alive(server.pid)


@pytest.mark.system
def test_two_scripts_starting_at_once_start_one_server(tmp_path):
    home = tmp_path / "prefect-home"
    procs = []
    for name in ("left", "right"):
        path = tmp_path / f"{name}.py"
        path.write_text(f"NAME = {name!r}\n" + textwrap.dedent(SCRIPT))
        env = embedded_env(str(home))
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


@pytest.mark.integration
def test_the_flow_run_heartbeats_once_per_interval_and_its_end_does_not_wait(tune_env):
    """The ``tune`` run's heartbeats (what a zombie-run automation watches) are popflow's:
    one at its start and one per interval after, as Prefect's engine sends them. Prefect's
    own are off for it: they came from a thread the run's end waited 0.5-1 s for, and
    both would have been sent at the start."""
    from prefect.events.worker import EventsWorker

    from popflow.flows.record.heartbeat import EVENT

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
    beats: list[Any] = []

    def recorded() -> bool:
        beats[:] = events(EVENT, resource_id)
        return bool(beats and events("prefect.flow-run.Completed", resource_id))

    # the server persists events every few seconds; the count is checked either way
    with contextlib.suppress(AssertionError):
        wait_for(recorded, 60, "the heartbeat and the end in the API", interval_s=0.5)
    assert len(beats) == 1, beats  # the default interval (180 s) outlasts this run
    (beat,) = beats
    assert beat.resource["prefect.resource.name"] == flow_run.name
    roles = {r.role: r.id for r in beat.related}
    assert roles["flow"] == f"prefect.flow.{flow_run.flow_id}"


def _round_task_runs(name: str, count: int) -> list[Any]:
    """The ``count`` finished round task runs of experiment ``name``, by start time: the
    server records task runs from their events, a moment after the run's end."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.events.worker import EventsWorker

    async def read(client: Any, ids: list[Any]) -> list[Any]:
        return await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids))
        )

    EventsWorker.drain_all(timeout=10)
    found: list[Any] = []

    def finished() -> bool:
        found[:] = [t for t in tune_runs(name, read) if t.end_time is not None]
        return len(found) >= count

    with contextlib.suppress(
        AssertionError
    ):  # the server writes events down every few seconds; the caller checks the count
        wait_for(finished, 60, f"{count} finished round task runs", interval_s=0.5)
    return sorted(found, key=lambda t: t.start_time)


@pytest.mark.integration
def test_the_flow_run_is_running_before_its_first_round_and_holds_every_round(tune_env):
    """Where a server answers, the first round waits for the flow run. Before: the record
    began after the cluster's start, so the ``tune`` run started seconds after its first
    rounds (``make demo``: a 2 s run whose six rounds spanned 6 s, drawn before it)."""
    sleepy_run("holds-rounds", 0.1, **tune_env)
    (flow_run,) = tune_runs("holds-rounds")
    rounds = _round_task_runs("holds-rounds", 3)
    assert [t.name for t in rounds] == ["round-1", "round-2", "round-3"]
    assert flow_run.start_time <= rounds[0].start_time, (flow_run.start_time, rounds[0])
    assert flow_run.end_time >= rounds[-1].end_time
    said = run_logs("holds-rounds")
    assert not any(m.startswith("this record started ") for m in said), said


@pytest.mark.integration
def test_a_late_record_gives_each_round_its_real_times_and_says_it_was_late(tune_env, monkeypatch):
    """The record held back until the training ended (as while a first run's Prefect
    server starts): each round's task run still spans the round's own time (a step of
    0.3 s per trial), in order, before the flow run began; each says it was recorded
    late, and the run's log says when its record started. Before, every round's task
    run was the few milliseconds the record took to replay it, after the training."""
    ended = threading.Event()
    real_end, real_objects = run_feed.RunFeed.end, prefect_flow.prefect_objects

    def end(feed: RunFeed, event: RunEnd) -> None:
        real_end(feed, event)
        ended.set()

    def late_objects() -> Any:
        assert ended.wait(timeout=300)
        return real_objects()

    monkeypatch.setattr(run_feed.RunFeed, "end", end)
    monkeypatch.setattr(prefect_flow, "prefect_objects", late_objects)
    monkeypatch.setattr(round_runs, "LATE_S", 0.05)  # held back: later than this, surely
    monkeypatch.setattr(training, "RECORD_WAIT_S", 0.0)  # as for a server that must start
    monkeypatch.setattr(prefect_flow, "early_api_url", lambda: None)  # not known before

    sleepy_run("late-record", 0.3, **tune_env)
    (flow_run,) = tune_runs("late-record")
    rounds = _round_task_runs("late-record", 3)
    assert [t.name for t in rounds] == ["round-1", "round-2", "round-3"]
    for before, after in itertools.pairwise(rounds):
        assert after.start_time >= before.end_time  # one after the other, as they ran
    for t in rounds:
        assert (t.end_time - t.start_time).total_seconds() >= 0.3, t
        assert t.end_time <= flow_run.start_time  # they happened before the record began
        assert (
            t.state.message.startswith("recorded ") and "after the round ended" in t.state.message
        )
    said = run_logs("late-record")
    assert any(m.startswith("this record started ") for m in said), said


@pytest.mark.system
def test_a_kept_server_whose_ui_calls_another_api_is_replaced(tmp_path, monkeypatch):
    """A server kept from an older popflow (its UI sent to port 4200) answers health but
    its UI shows no runs: the next run stops it by its PID and starts one that serves its
    UI, instead of printing its address."""
    home = tmp_path / "prefect-home"
    home.mkdir()
    port = local_server._free_port()
    code = textwrap.dedent(f"""
        import http.server, json
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = json.dumps({{"api_url": "http://127.0.0.1:4200/api"}}).encode()
                self.send_response(200); self.end_headers(); self.wfile.write(body)
            def log_message(self, *a): pass
        http.server.HTTPServer(("127.0.0.1", {port}), H).serve_forever()
    """)
    old = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        (home / local_server.RECORD).write_text(
            json.dumps({"pid": old.pid, "port": port, "home": str(home)})
        )
        kept = local_server.LocalServer(old.pid, port, str(home))
        with contextlib.suppress(AssertionError):  # the assertion below says what went wrong
            wait_for(kept.answers, 30, "the kept server to answer", interval_s=0.1)
        assert local_server.running(home) == kept  # it answers: before, it was reused
        started = local_server.LocalServer(os.getpid(), port + 1, str(home))
        monkeypatch.setattr(local_server, "_start", lambda h, port=None: started)
        assert local_server.local_server(home) == started
        assert old.wait(timeout=30) is not None  # stopped by its PID
    finally:
        if old.poll() is None:
            old.kill()


@pytest.mark.integration
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


@pytest.mark.integration
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
    boards = artifacts("hung-leaderboard")  # rounds sent faster than the API takes coalesce
    assert 1 <= len(boards) <= 3, boards
    assert "after round 3" in max(boards, key=lambda b: b.created).description, boards
    assert calls == ["/nowhere"]
    release.set()
    board.final_text("# done", "done")  # the last drawing, once one was drawn
    assert refresh.drawn == 2 and len(calls) == 2


@pytest.mark.integration
def test_a_long_enough_run_redraws_its_plots_while_it_goes(tune_env, monkeypatch):
    monkeypatch.setattr(plot_artifacts, "PLOTS_INTERVAL_S", 0.0)  # every round may draw
    parity_run(
        [10, 20, 40],
        iterations=4,
        name="live-plots",
        **tune_env,
    )
    versions = artifacts("live-plots-plots")
    assert len(versions) >= 2, versions  # while it ran, and its end
    assert all("data:image/png;base64," in v.data for v in versions)
    assert "as of round 4" in versions[-1].description
