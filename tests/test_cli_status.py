"""Reading an experiment back: ``ResultGrid.from_path`` and ``popflow status``/``show``,
on real runs (finished, cut short by ``max_rounds``, a driver SIGKILLed), and the
command's one-line user errors."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.lease_holder import hold_lease

from popflow import ResultGrid, choice, grid_search, run, uniform
from popflow.flows.api.cli import main
from popflow.flows.console.status_view import compact_config, status_lines
from popflow.flows.experiment.reading import ExperimentState, read_committed, state_of
from popflow.flows.experiment.trial_logs import result_lines
from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import ExperimentLog
from popflow.infra.store.lease import lease_holder, live_holder
from popflow.schedulers import ASHAScheduler, PopulationBasedTraining
from popflow.tasks import Trainable

HERE = os.path.dirname(os.path.abspath(__file__))
POPFLOW = os.path.join(os.path.dirname(sys.executable), "popflow")
STOP_AT = 6


class Climber(Trainable):
    """Climbs ``lr`` per iteration (twice that with "adam"); the height is its state.
    Raises at iteration ``fail_at``, if given."""

    def setup(self, config: dict[str, Any]) -> None:
        self.height = 0.0

    def step(self) -> dict[str, Any]:
        if self.iteration + 1 == self.config.get("fail_at"):
            raise RuntimeError(f"fell at iteration {self.iteration + 1}")
        self.height += self.config["lr"] * (2.0 if self.config.get("opt") == "adam" else 1.0)
        return {"score": self.height}

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {"height": self.height}

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.height = checkpoint["height"]


@pytest.fixture(scope="module")
def experiments(prefect_server, dask_cluster, tmp_path_factory) -> dict[str, Any]:
    """ASHA run to the end (its grid too; 2 of its 4 trials fail at once), and synch PBT cut short
    after 2 rounds."""
    storage = str(tmp_path_factory.mktemp("status") / "results")
    common = {
        "metric": "score",
        "mode": "max",
        "stop": {"training_iteration": STOP_AT},
        "seed": 5,
        "storage": storage,
        "dask_address": dask_cluster,
    }
    asha = ASHAScheduler(grace_period=1, reduction_factor=2, max_t=STOP_AT)
    space = {"lr": uniform(0.05, 1.0), "opt": choice(["sgd", "adam"])}
    failing = {**space, "fail_at": grid_search([None, 1])}
    grid = run(Climber, failing, scheduler=asha, num_samples=2, name="done", **common)
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=2,
        hyperparam_mutations={"lr": [0.1, 0.5, 0.9]},
        synch=True,
    )
    run(Climber, space, scheduler=pbt, num_samples=3, name="cut", max_rounds=2, **common)
    return {
        "done": os.path.join(storage, "done"),
        "grid": grid,
        "cut": os.path.join(storage, "cut"),
        "storage": storage,
    }


def files(path: str) -> dict[str, tuple[int, int]]:
    """Every file under ``path``: its size and modification time."""
    out = {}
    for p in Path(path).rglob("*"):
        if p.is_file():
            st = p.stat()
            out[str(p)] = (st.st_size, st.st_mtime_ns)
    return out


def status(path: str, capsys, *extra: str) -> list[str]:
    assert main(["status", path, *extra]) == 0
    return capsys.readouterr().out.splitlines()


def popflow(*args: str, cwd: str = HERE, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [POPFLOW, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )


# -- ResultGrid.from_path ------------------------------------------------------------


@pytest.mark.integration
def test_from_path_is_the_grid_the_run_returned(experiments):
    ran, read = experiments["grid"], ResultGrid.from_path(experiments["done"])
    assert len(read) == len(ran) == 4
    assert read.experiment_path == ran.experiment_path
    assert (
        list(map(str, read.errors)) == list(map(str, ran.errors))
        and read.num_errors == ran.num_errors == 2
    )
    assert all("fell at iteration 1" in str(e) for e in read.errors)
    assert read.num_terminated == ran.num_terminated == 2
    assert [r.status for r in read] == [r.status for r in ran]
    assert [r.trial_id for r in read] == [r.trial_id for r in ran]
    best, expected = read.get_best_result(), ran.get_best_result()  # the run's metric and mode
    assert (best.trial_id, best.config, best.metrics) == (
        expected.trial_id,
        expected.config,
        expected.metrics,
    )
    assert best.checkpoint.path == expected.checkpoint.path
    assert best.checkpoint.to_dict() == {"height": best.metrics["score"]}
    for scope in ("avg", "all", "last-5-avg"):
        kwargs = {"metric": "score", "mode": "min", "scope": scope, "filter_nan_and_inf": False}
        assert read.get_best_result(**kwargs).trial_id == ran.get_best_result(**kwargs).trial_id
    assert read.get_dataframe().equals(ran.get_dataframe())
    assert read.get_dataframe("score", "max").equals(ran.get_dataframe("score", "max"))
    assert [r.history for r in read] == [r.history for r in ran]


@pytest.mark.integration
def test_from_path_of_an_unfinished_run_gives_its_committed_trials(experiments):
    path = experiments["cut"]
    before = files(path)
    grid = ResultGrid.from_path(path)
    commit = ExperimentLog(Storage(path)).latest()
    assert commit["round"] == 2 and len(grid) == 3
    for r, t in zip(grid, commit["trials"], strict=True):
        assert r.trial_id == t["trial_id"] and r.status == t["status"] != "TERMINATED"
        assert len(r.history) == t["num_results"] == r.metrics["training_iteration"] == 4
    assert grid.get_best_result().metrics["score"] == max(r.metrics["score"] for r in grid)
    assert files(path) == before  # read only


# -- popflow status --------------------------------------------------------------------


@pytest.mark.integration
def test_status_of_a_finished_experiment_marks_the_best(experiments, capsys):
    lines = status(experiments["done"], capsys)
    rounds = read_committed(experiments["done"]).round
    assert lines[0] == (
        f"done: finished, {rounds} round{'s' * (rounds != 1)} committed, "
        "AsyncHyperBandScheduler, metric score (max)"
    )
    best = experiments["grid"].get_best_result()
    (marked,) = [line for line in lines if line.startswith("* ")]
    assert marked.split()[1:5] == [
        best.trial_id,
        best.status,
        str(best.metrics["training_iteration"]),
        f"{best.metrics['score']:.6g}",
    ]
    assert f"lr={best.config['lr']:.6g}" in marked and f"opt={best.config['opt']}" in marked
    assert lines[-1] == f"best checkpoint: {best.checkpoint.path}"
    assert lines[1] == "4 trials: 2 ERROR, 2 TERMINATED"
    trials = [line for line in lines if "_0000" in line and line[:2] in ("* ", "  ")]
    assert len(trials) == 4


@pytest.mark.system
def test_status_interrupted_running_and_interrupted_again(experiments, capsys):
    path = experiments["cut"]
    lines = status(path, capsys)
    assert lines[0].startswith("cut: interrupted, 2 rounds committed, PopulationBasedTraining")
    assert lines[1] == f"resume with: popflow resume {path}"
    holder = hold_lease(path)  # a driver, as far as the lease tells
    try:
        assert holder.stdout.readline().strip() == "held"
        before = files(path)
        lines = status(path, capsys)
        assert lines[0].startswith("cut: running, 2 rounds committed")
        assert lines[1].startswith(f"driver: pid {holder.pid} on {socket.gethostname()}")
        assert files(path) == before and lease_holder(Storage(path))["pid"] == holder.pid
    finally:
        holder.kill()
        holder.wait()
    # its lease has 600 s to go, but its process is gone: nobody runs the experiment
    assert lease_holder(Storage(path))["pid"] == holder.pid
    assert live_holder(Storage(path)) is None
    assert status(path, capsys)[0].startswith("cut: interrupted")


@pytest.mark.system
def test_status_of_an_interrupted_run_shows_what_its_commits_hold(
    prefect_server, s3_server, s3_url
):
    """On S3 the trials' logs are written every 30 s; a driver killed before that leaves
    its results in the commits only, and status shows them there."""
    _, options = s3_server
    env = {**os.environ, "POPFLOW_TEST_STORAGE_OPTIONS": json.dumps(options)}
    driver = [sys.executable, os.path.join(HERE, "crash_driver.py"), s3_url, "exp", "fifo"]
    killed = subprocess.run(
        [*driver, "--kill-at", "commit-after:3"],
        env=env,
        start_new_session=True,
        capture_output=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-3000:]
    path = f"{s3_url}/exp"
    storage = Storage(path, options)
    trials = ExperimentLog(storage).latest()["trials"]
    logged = {
        t["trial_id"]: len(result_lines(storage, t["dirname"], t["num_results"])) for t in trials
    }
    assert any(logged[t["trial_id"]] < t["num_results"] for t in trials)  # the logs lag
    shown = popflow("status", path, "--storage-options", json.dumps(options), COLUMNS="200")
    assert shown.returncode == 0, shown.stderr[-3000:]
    ids = {t["trial_id"] for t in trials}
    rows = {
        line[2:].split()[0]: line[2:].split()[1:4]
        for line in shown.stdout.splitlines()
        if line[:2] in ("* ", "  ") and line[2:].split()[0] in ids
    }
    assert len(rows) == len(trials) == 4
    for t in trials:  # ParityTrainable: mean_accuracy = a + iteration
        n = t["num_results"]
        expected = [str(n), str(t["config"]["a"] + n)] if n else ["-", "-"]
        assert rows[t["trial_id"]] == ["PENDING", *expected], shown.stdout
    assert shown.stdout.splitlines()[-2].startswith("best: ")


@pytest.mark.system
def test_a_reader_that_stops_early_ends_the_command_quietly(experiments):
    """``popflow status ... | head``: a pipe whose reader is gone ends the command with
    status 1 and nothing on stderr (no BrokenPipeError), buffered or not."""
    for command in ("status", "show"):
        for unbuffered in ("1", ""):
            read, write = os.pipe()
            os.close(read)  # the reader is gone before anything is written
            try:
                out = subprocess.run(
                    [POPFLOW, command, experiments["done"]],
                    stdout=write,
                    stderr=subprocess.PIPE,
                    text=True,
                    timeout=120,
                    env={**os.environ, "PYTHONUNBUFFERED": unbuffered},
                )
            finally:
                os.close(write)
            assert (command, out.returncode, out.stderr) == (command, 1, "")


@pytest.mark.integration
def test_status_and_show_never_write_and_plot_writes_only_its_pngs(experiments, tmp_path, capsys):
    for path in (experiments["done"], experiments["cut"]):
        before = files(path)
        status(path, capsys)
        assert main(["show", path]) == 0
        assert files(path) == before
    capsys.readouterr()
    path = experiments["done"]
    before = files(path)
    out = tmp_path / "pngs"
    assert main(["plot", path, "--out", str(out)]) == 0
    written = capsys.readouterr().out.split()
    assert written and all(p.startswith(f"{out}/") and p.endswith(".png") for p in written)
    assert files(path) == before
    assert main(["plot", path]) == 0  # by default into <path>/plots
    written = capsys.readouterr().out.split()
    after = files(path)
    assert sorted(set(after) - set(before)) == sorted(written)
    assert all(p.startswith(f"{path}/plots/") and p.endswith(".png") for p in written)
    assert {p: after[p] for p in before} == before


@pytest.mark.system
def test_status_and_show_import_no_prefect_dask_or_pandas(experiments):
    heavy = {"prefect", "distributed", "dask", "pandas", "matplotlib"}
    for command in ("status", "show"):
        code = (
            "import sys; from popflow.flows.api.cli import main; "
            f"main([{command!r}, {experiments['cut']!r}]); "
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {heavy!r}))"
        )
        probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert probe.stdout.splitlines()[-1] == "[]", probe.stdout + probe.stderr


@pytest.mark.integration
def test_status_lines_fit_the_screen(experiments):
    experiment = read_committed(experiments["done"])
    state = state_of(experiment, None)
    lines = status_lines(experiment, state, None, 40, "popflow resume x")
    table = [line for line in lines if line[:2] in ("* ", "  ")]
    assert table and all(len(line) <= 40 for line in table)
    assert any(line.endswith("…") for line in table)  # the configs were cut
    assert lines[-1].startswith("best checkpoint: /")  # a path is never cut


@pytest.mark.integration
def test_state_is_finished_running_or_interrupted(experiments):
    done, cut = read_committed(experiments["done"]), read_committed(experiments["cut"])
    driver = {"pid": 1, "host": "h", "expires": 4e9}
    assert state_of(done, None) is state_of(done, driver) is ExperimentState.FINISHED
    assert state_of(cut, driver) is ExperimentState.RUNNING
    assert state_of(cut, None) is ExperimentState.INTERRUPTED


@pytest.mark.unit
def test_compact_config_flattens_and_shortens():
    config = {"lr": 0.000123456789, "opt": "adam", "net": {"width": 64, "act": "relu"}}
    assert compact_config(config) == "lr=0.000123457 opt=adam net/width=64 net/act=relu"


@pytest.mark.system
def test_a_killed_driver_is_interrupted_its_running_trials_pending_and_resumable(
    prefect_server, tmp_path
):
    driver = [sys.executable, os.path.join(HERE, "crash_driver.py"), str(tmp_path), "exp", "fifo"]
    killed = subprocess.run(
        [*driver, "--kill-at", "commit-after:4"],
        start_new_session=True,
        capture_output=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()[-3000:]
    path = str(tmp_path / "exp")
    committed = [t["status"] for t in ExperimentLog(Storage(path)).latest()["trials"]]
    assert "RUNNING" in committed  # the commit caught segments in flight
    shown = popflow("status", path, COLUMNS="200")
    assert shown.returncode == 0, shown.stderr[-3000:]
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("exp: interrupted, 3 rounds committed, FIFOScheduler")
    assert lines[1] == f"resume with: popflow resume {path}"
    assert "RUNNING" not in shown.stdout and f"{len(committed)} PENDING" in shown.stdout
    assert lines[-1].startswith(f"best checkpoint: {path}/ParityTrainable_")

    resumed = popflow("resume", path, "--n-workers", "2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "exp: finished, 4 trials, 0 errors" in resumed.stdout
    assert "HTTP Request" not in resumed.stdout + resumed.stderr
    assert "prefect.flow_runs Beginning flow run" in resumed.stderr  # Prefect's INFO still shows
    lines = popflow("status", path).stdout.splitlines()
    assert lines[0].startswith("exp: finished")
    assert lines[-2].endswith(", mean_accuracy 64")  # a = 40, after 24 steps


# -- popflow show ----------------------------------------------------------------------


@pytest.mark.integration
def test_show_prints_each_trials_metric(experiments, capsys):
    assert main(["show", experiments["done"]]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("done: finished, round ")
    for r in experiments["grid"]:
        (line,) = [line for line in out if r.trial_id in line]
        value = f"{r.metrics['score']:.6g}" if r.error is None else "-"  # failed at once
        assert f"score {value} " in line
        assert f"results {len(r.history):>5}" in line
    assert out[-1] == "metric: score (max)"


# -- user errors -----------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("command", ["status", "show", "plot", "resume"])
def test_a_missing_experiment_is_one_line_and_exit_code_2(command, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, str(tmp_path / "nothing")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"popflow: no committed experiment at {tmp_path}/nothing\n"


@pytest.mark.integration
def test_a_storage_root_is_answered_with_its_experiments(experiments, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["status", experiments["storage"]])
    assert exit_info.value.code == 2
    root = experiments["storage"]
    assert capsys.readouterr().err == (
        f"popflow: no committed experiment at {root} "
        f"(it holds the experiments cut, done: give {root}/<name>)\n"
    )


@pytest.mark.system
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["status", "foo://bucket/exp"], "popflow: cannot open 'foo://bucket/exp': Protocol not"),
        (["show", "s3://"], "popflow: 's3://' does not name an experiment folder"),
        (
            ["status", "/tmp/exp", "--credentials-block", "my-creds"],
            "popflow: `credentials_block` 'my-creds' holds S3 credentials",
        ),
        (
            ["status", "s3://popflow-bucket/exp", "--storage-options", "{}"],
            "popflow: storage listdir of s3://popflow-bucket/exp/.popflow/commits failed: "
            "NoCredentialsError",
        ),
    ],
)
def test_user_errors_are_one_line_without_a_traceback(args, message, tmp_path):
    no_aws = {  # nowhere to find credentials, and nothing asked of the network
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    out = subprocess.run(
        [sys.executable, "-m", "popflow.flows.api.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, **no_aws},
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stdout == "" and "Traceback" not in out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith(message)
    if "NoCredentialsError" in message:
        assert "--credentials-block NAME" in line  # the hint


@pytest.mark.system
def test_verbose_shows_the_traceback(tmp_path):
    args = [
        sys.executable,
        "-m",
        "popflow.flows.api.cli",
        "--verbose",
        "status",
        str(tmp_path / "x"),
    ]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "Traceback" in out.stderr and "NoExperiment: no committed experiment" in out.stderr
