"""The trial table on the console: redrawn in place on a terminal (a real pseudo-terminal),
plain lines through a pipe, and what each ``verbose`` shows."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.polling import wait_for
from support.scripts import embedded_env
from test_console import run_script

from popflow.flows.console.live_table import MAX_ROWS, LiveTable
from popflow.flows.experiment.trial_table import TrialRecord
from popflow.infra import local_server
from popflow.schedulers import Trial, TrialStatus

SCRIPT = textwrap.dedent(
    """
    import sys
    import time

    from popflow import tune


    def objective(config):
        for step in range(1, 13):
            time.sleep(float(sys.argv[2]))
            tune.report({"score": config["x"] * step})


    if __name__ == "__main__":
        tuner = tune.Tuner(
            objective,
            param_space={"x": tune.grid_search([1, 2])},
            tune_config=tune.TuneConfig(metric="score", mode="max", seed=3),
            run_config=tune.RunConfig(
                name="watched", storage_path="results", verbose=int(sys.argv[1])
            ),
        )
        print("best", tuner.fit().get_best_result().config)
    """
)
ESCAPE = re.compile(r"\x1b\[")
CURSOR_UP = "\x1b[1A"


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Iterator[Path]:
    """One Prefect home for this module's scripts: the first starts popflow's local
    server, the others reuse it (as a user's next runs do); stopped at the end."""
    path = tmp_path_factory.mktemp("prefect-home")
    try:
        yield path
    finally:
        local_server.stop(path)


def _env(home: Path) -> dict[str, str]:
    env = embedded_env(home)
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    return env


def run_in_terminal(tmp_path, home: Path, verbose: int) -> str:
    """The script's output as a terminal shows it: stdout and stderr on a pseudo-terminal.
    Each result comes 0.5 s after the one before, so the table is redrawn as it trains."""
    (tmp_path / "script.py").write_text(SCRIPT)
    leader, follower = pty.openpty()
    env = {**_env(home), "COLUMNS": "160", "LINES": "40", "TERM": "xterm-256color"}
    proc = subprocess.Popen(
        [sys.executable, "script.py", str(verbose), "0.5"],
        cwd=tmp_path,
        env=env,
        stdin=follower,
        stdout=follower,
        stderr=follower,
        close_fds=True,
    )
    os.close(follower)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: the other end closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read)
    reader.start()
    rc = proc.wait(timeout=300)
    reader.join(timeout=30)
    os.close(leader)
    out = b"".join(chunks).decode(errors="replace")
    assert rc == 0, out[-3000:]
    return out


def run_through_pipe(tmp_path, home: Path, verbose: int) -> str:
    """The script's output through a pipe; its results come as fast as they can (the
    table is printed once, at the end, whatever the run's length)."""
    return run_script(tmp_path, str(verbose), "0", script=SCRIPT, home=home)


@pytest.mark.system
def test_on_a_terminal_the_table_is_redrawn_in_place_under_the_log_lines(tmp_path, home):
    out = run_in_terminal(tmp_path, home, 2)
    assert "best {'x': 2}" in out
    assert CURSOR_UP in out, out[-3000:]  # the live region moved up to redraw itself
    frames = out.count("Trial status:")
    assert frames >= 3, out[-3000:]  # drawn while running, not only at the end
    assert re.search(r"Trial status: 2 RUNNING", out), out[-3000:]
    # a FIFO trial is one segment: its rows move with the results it sends as it trains
    assert re.search(r"objective_\S+\s+RUNNING\s+[12]\s+([1-9]|1[01])\s", out), out[-3000:]
    assert re.search(r"Trial status: 2 TERMINATED .* done", out), out[-3000:]
    # a log line printed while the table is up lands above it, whole
    assert re.search(r"watched finished: 2 trials, 0 errors", out), out[-3000:]
    assert re.search(r"Best trial \S+: score=24 at iteration 12", out), out[-3000:]


@pytest.mark.system
def test_through_a_pipe_the_table_is_plain_text_printed_once_at_the_end(tmp_path, home):
    out = run_through_pipe(tmp_path, home, 2)
    assert not ESCAPE.search(out), out[-3000:]
    assert out.count("Trial status:") == 1  # a short run: no periodic print before the end
    header = [line for line in out.splitlines() if line.startswith("popflow: watched at ")]
    assert len(header) == 1 and " · seed 3 · FIFOScheduler · Dask dashboard http" in header[0]
    rows = [line for line in out.splitlines() if line.startswith("|") and "objective_" in line]
    assert len(rows) == 2 and all("| TERMINATED |" in row for row in rows), out
    best = [row for row in rows if row.startswith("| * ")]
    assert len(best) == 1 and best[0].rstrip("|").split("|")[-1].strip() == "24", rows
    assert re.search(r"Best trial \S+: score=24 at iteration 12, config x=2$", out, re.M), out


@pytest.mark.system
def test_verbose_1_shows_the_status_line_and_no_table(tmp_path, home):
    out = run_through_pipe(tmp_path, home, 1)
    assert "Trial status: 2 TERMINATED" in out
    assert not [line for line in out.splitlines() if line.startswith("|")], out


@pytest.mark.system
def test_verbose_3_shows_every_result(tmp_path, home):
    out = run_through_pipe(tmp_path, home, 3)
    reported = re.findall(
        r"Trial (objective_\S+) reported score=(\d+), training_iteration=(\d+)", out
    )
    assert len(reported) == 24, out[-3000:]
    assert sorted({int(it) for _, _, it in reported}) == list(range(1, 13))
    assert "round 1 committed" in out  # the detail the console leaves out below 3


def _records(n: int) -> list[TrialRecord]:
    records = []
    for i in range(n):
        trial = Trial(f"t{i:03d}", {"lr": i / 10, "fixed": 1}, trainable_name="f")
        trial.status = TrialStatus.RUNNING if i == 0 else TrialStatus.TERMINATED
        trial.last_result = {"score": float(i % 7), "training_iteration": i}
        records.append(TrialRecord(trial=trial, index=i, dirname=f"f_t{i:03d}"))
    return records


@pytest.mark.unit
def test_a_large_population_shows_the_best_and_live_trials_and_counts_the_rest():
    out = io.StringIO()
    table = LiveTable(
        2, name="big", path="/x/big", seed=0, scheduler="PBT", metric="score", mode="max",
        file=out,
    )  # fmt: skip
    records = _records(50)
    table.start(None)
    table.close(records, None, "big finished")
    text = out.getvalue()
    rows = [line for line in text.splitlines() if re.match(r"\| [* ] f_t\d{3}", line)]
    assert len(rows) == MAX_ROWS, text
    assert any(line.startswith("|   f_t000") for line in rows)  # the running trial
    assert any(line.startswith("| * f_t006") for line in rows)  # the first best (score 6)
    assert f"... {50 - MAX_ROWS} more trials not shown ({50 - MAX_ROWS} TERMINATED)" in text
    header = text.splitlines()[0]
    assert "lr" in text and " fixed " not in text, header  # only what varies is a column


@pytest.mark.integration
def test_a_segment_sends_its_latest_result_to_the_driver_as_it_trains(dask_cluster):
    """Over the cluster for real: a worker's sender reaches the driver's subscription, at
    most one event per interval, and what came before the segment's outcome is dropped."""
    import time

    from popflow.flows.console.live_results import LiveResults
    from popflow.tasks import progress_events

    live = LiveResults()
    live.subscribe(dask_cluster)

    def train(topic: str) -> int:
        progress_events.PROGRESS_INTERVAL_S = 0.0  # in this worker process only
        sender = progress_events.ProgressSender(topic, "t7")
        sender._due = 0.0
        for it in range(1, 4):
            sender.result({"training_iteration": it, "loss": 1.0 / it, "blob": [1, 2]})
        return it

    assert dask_cluster.submit(train, live.topic, pure=False).result() == 3
    wait_for(
        lambda: (live.latest("t7") or {}).get("training_iteration") == 3, 30, "the third result"
    )
    assert live.latest("t7") == {"training_iteration": 3, "loss": 1.0 / 3}  # numbers only
    live.reduced("t7")
    assert live.latest("t7") is None
    live._event((time.time() - 60, {"trial_id": "t7", "result": {"training_iteration": 9}}))
    assert live.latest("t7") is None  # sent before the outcome came back: history
    live.close()


@pytest.mark.unit
def test_through_a_pipe_a_long_run_prints_its_status_line_every_interval():
    """Plain output is periodic: a status line when the interval has passed, none before;
    the table once, at the end (a pipe keeps every print: ``make demo 2>&1 | wc -l``)."""
    now = [1000.0]
    out = io.StringIO()
    table = LiveTable(
        2, name="long", path="/x/long", seed=0, scheduler="PBT", metric="score", mode="max",
        file=out, interval_s=30.0, clock=lambda: now[0],
    )  # fmt: skip
    records = _records(3)
    table.start(None)
    for step in range(1, 100):  # 99 ticks over 99 s: prints at 30, 60 and 90 s
        now[0] = 1000.0 + step
        table.tick(records, round_no=step)
    frames = re.findall(r"Trial status: .* · round (\d+) · 0:0(\d:\d\d)", out.getvalue())
    assert frames == [("30", "0:30"), ("60", "1:00"), ("90", "1:30")], out.getvalue()
    assert len(out.getvalue().splitlines()) == 4 and "Trial name" not in out.getvalue()
    table.close(records, None, "long finished")
    assert out.getvalue().count("Trial name") == 1


def _population() -> list[TrialRecord]:
    """PBT's demo population: long trainable names, three hyperparameters."""
    records = []
    for i in range(8):
        config = {"lr": 0.0030393 * (i + 1) / 3, "some_other_factor": 1 + i % 2, "m": 0.9 - i / 100}
        trial = Trial(f"e9500_{i:05d}", config, trainable_name="PBTBenchmarkExample")
        trial.status = TrialStatus.TERMINATED
        trial.last_result = {
            "mean_accuracy": 200.123 + i, "training_iteration": 230 + i, "time_total_s": 12.3,
        }  # fmt: skip
        records.append(TrialRecord(trial=trial, index=i, dirname=f"PBT_e9500_{i:05d}"))
    return records


def _final_table(width: int) -> str:
    out = io.StringIO()
    table = LiveTable(
        2, name="pbt", path="/x/pbt", seed=0, scheduler="PBT", metric="mean_accuracy",
        mode="max", file=out, width=width,
    )  # fmt: skip
    table.start(None)
    table.close(_population(), None, "pbt finished")
    return out.getvalue()


@pytest.mark.unit
def test_at_80_columns_the_table_keeps_ids_iteration_time_and_metric():
    """Short trial ids (Ray's ``e67f7_00001``), the metric, iteration and time kept;
    hyperparameter columns left out, last first, and named in the caption."""
    text = _final_table(80)
    assert max(len(line) for line in text.splitlines()) <= 80, text
    header = next(line for line in text.splitlines() if "Trial id" in line)
    assert re.findall(r"[\w()]+(?: \(s\))?", header) == [
        "Trial", "id", "status", "lr", "iter", "time (s)", "mean_accuracy"
    ], header  # fmt: skip
    row = r"^\| ([* ]) (e9500_\d{5}) \| TERMINATED \| +[\d.]+ \| +(\d+) \| +[\d.]+ \| +([\d.]+) \|$"
    rows = re.findall(row, text, re.M)
    assert [(star, tid, it) for star, tid, it, _ in rows] == [
        (" " if i < 7 else "*", f"e9500_{i:05d}", str(230 + i)) for i in range(8)
    ], text
    assert [metric for *_, metric in rows] == [f"{200.123 + i:.4g}" for i in range(8)]
    assert "not shown at 80 columns: some_other_factor, m" in text
    status = " ".join(text.split())  # the status line wraps at 80 columns
    assert "best e9500_00007 mean_accuracy=207.1 (iter 237)" in status  # the short id too


@pytest.mark.unit
def test_at_120_columns_every_column_shows_and_names_where_they_fit():
    text = _final_table(120)
    assert max(len(line) for line in text.splitlines()) <= 120, text
    header = next(line for line in text.splitlines() if "Trial id" in line)
    for column in ("lr", "some_other_factor", "m", "iter", "time (s)", "mean_accuracy"):
        assert f" {column} |" in header, text
    assert "| * e9500_00007 | TERMINATED | 0.008105 |" in text, text
    assert "not shown" not in text
    wide = _final_table(140)  # the full names fit: Ray's "PBTBenchmarkExample_e9500_00007"
    assert "| * PBTBenchmarkExample_e9500_00007 | TERMINATED | 0.008105 |" in wide, wide
    assert " total time (s) |" in wide
