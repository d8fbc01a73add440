"""What a newcomer sees: a Ray Tune script on the embedded default prints where its results
go and its seed, and no Prefect telemetry noise."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from support.scripts import embedded_env

SCRIPT = textwrap.dedent(
    """
    import sys

    from popflow import tune

    VERBOSE = int(sys.argv[1]) if len(sys.argv) > 1 else None


    def objective(config):
        for step in range(3):
            tune.report({"score": config["x"] * step})


    if __name__ == "__main__":
        tuner = tune.Tuner(
            objective,
            param_space={"x": tune.grid_search([1, 2])},
            tune_config=tune.TuneConfig(metric="score", mode="max", seed=7),
            run_config=tune.RunConfig(name="newcomer", storage_path="results", verbose=VERBOSE),
        )
        print("best", tuner.fit().get_best_result().config)
    """
)


def run_script(tmp_path, *args: str, script: str = SCRIPT, home=None) -> str:
    """``script`` run as a user would, in a fresh process on the embedded default, with
    a Prefect home of its own (``home``, or a fresh one); its stdout and stderr."""
    (tmp_path / "script.py").write_text(script)
    env = embedded_env(home or tmp_path / "prefect-home")  # the user's own
    proc = subprocess.run(
        [sys.executable, "script.py", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    return out


@pytest.mark.system
def test_the_embedded_default_shows_path_and_seed_and_no_telemetry(tmp_path):
    out = run_script(tmp_path)
    assert "best {'x': 2}" in out
    path = tmp_path / "results" / "newcomer"
    assert f"popflow: newcomer at {path} · seed 7 · " in out  # the table's header
    assert " · Dask dashboard http://127.0.0.1:" in out
    assert "telemetry" not in out.lower() and "database is locked" not in out
    # the slots are given back before the cluster closes: no warning about tasks it cut off
    assert "distributed" not in out and "WARNING" not in out, out[-3000:]


@pytest.mark.system
def test_verbose_0_keeps_the_console_quiet(tmp_path):
    out = run_script(tmp_path, "0")
    assert "best {'x': 2}" in out
    # Prefect's server start/stop (printed at exit, after the run) at most; no run lines
    assert [
        line for line in out.splitlines() if "INFO" in line and "temporary server" not in line
    ] == []
    assert "Flow run" not in out and "round 1 committed" not in out


@pytest.mark.unit
def test_a_users_own_telemetry_setting_is_kept(monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from popflow.flows.record.prefect_server import ANALYTICS, quiet_embedded_server

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):  # the embedded default
        monkeypatch.setenv(ANALYTICS, "true")
        quiet_embedded_server()
        assert os.environ[ANALYTICS] == "true"
        monkeypatch.delenv(ANALYTICS)
        quiet_embedded_server()
        assert os.environ[ANALYTICS] == "false"
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:1/api"}):
        monkeypatch.delenv(ANALYTICS)
        quiet_embedded_server()  # the user's own server: nothing to change
        assert ANALYTICS not in os.environ


@pytest.mark.unit
def test_the_embedded_server_is_waited_for_longer_unless_the_user_says(monkeypatch):
    """Prefect waits 20 s for its embedded server; on a loaded 2-core machine its first
    start took longer (``make demo`` failed with "Timed out while attempting to connect
    to ephemeral Prefect API server"), so popflow waits 90 s, unless the user set it."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )

    from popflow.flows.record.prefect_server import (
        EMBEDDED_STARTUP_TIMEOUT_S,
        STARTUP_TIMEOUT,
        embedded_server_settings,
    )

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv(STARTUP_TIMEOUT, raising=False)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        before = PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()
        with embedded_server_settings():
            assert PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value() == 90
        assert PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value() == before
        monkeypatch.setenv(STARTUP_TIMEOUT, "33")
        with embedded_server_settings():  # the user's own: not overridden
            assert PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value() == before
    assert EMBEDDED_STARTUP_TIMEOUT_S == 90


def run_demo(tmp_path, *args: str) -> str:
    """``make demo``'s script (its own INFO logging), smoke-sized, on the embedded default."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = embedded_env(str(tmp_path / "prefect-home"))
    proc = subprocess.run(
        [sys.executable, os.path.join(root, "examples", "pbt_benchmark.py"), "--smoke-test",
         "--storage", str(tmp_path), "--name", "demo", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    return out


def run_make_demo(tmp_path) -> str:
    """``make demo`` itself (its script, arguments and settings), with its results and
    a fresh Prefect home in ``tmp_path``, in this interpreter; its whole output."""
    from popflow.infra import local_server

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    home = tmp_path / "prefect-home"
    env = embedded_env(home)
    try:
        proc = subprocess.run(
            ["make", "--no-print-directory", "-o", ".venv/.installed", "demo",
             f"PY={sys.executable}", f"DEMO_STORAGE={tmp_path / 'results'}"],
            cwd=root, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    finally:
        local_server.stop(home)  # the local server the demo started (kept for later runs)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    return out


#: the README's "`make demo`'s whole output is about 30 lines"
DEMO_LINES = 30


@pytest.mark.system
def test_make_demos_output_fits_on_a_screen(tmp_path):
    """By default the console has the run's start and end once each, the trial table and
    the best result: no line per decision, per round or per HTTP request (those are in
    the Prefect UI), and no shutdown noise."""
    import re

    out = run_make_demo(tmp_path)
    assert len(out.splitlines()) <= DEMO_LINES, out
    assert "[Exploit]" not in out and "round 1 committed" not in out, out
    assert "[pbt]" not in out and "HTTP Request" not in out, out  # a decision; Prefect's
    assert "distributed" not in out and "Still processing" not in out, out  # at exit
    assert "Finished in state Completed()" not in out, out  # Prefect's, per round task
    assert len(re.findall(r"pbt_benchmark_\S+: 8 trials", out)) <= 1, out
    assert len(re.findall(r"^\| [* ] PBTBenchmarkExample_\S+ \| TERMINATED", out, re.M)) == 8


@pytest.mark.system
def test_verbose_3_logs_each_decision_once_in_ray_tunes_words(tmp_path):
    """It used to be three times (the scheduler's line, the controller's and the round
    task's); now once, as Ray words it: the exploit, then each hyperparameter's change."""
    import re

    out = run_demo(tmp_path, "--verbose", "3")
    clones = re.findall(
        r"\[PopulationBasedTraining\] \[Exploit\] Cloning trial (\S+) \(score = [-\d.]+\) "
        r"into trial (\S+) \(score = [-\d.]+\)",
        out,
    )
    explores = re.findall(
        r"\[PopulationBasedTraining\] \[Explore\] Perturbed the hyperparameter config of "
        r"trial (\S+):\n(lr : [\d.e-]+ --- \(.+?\) --> [\d.e-]+)",
        out,
    )
    assert clones and len(clones) == len(explores), out
    assert [target for _, target in clones] == [target for target, _ in explores]
    perturbs = re.search(
        r"demo finished: .*PopulationBasedTraining: \d+ checkpoints, (\d+) perturbs", out
    )
    assert perturbs and int(perturbs.group(1)) == len(clones), out  # once each
    assert "round 1 committed" in out
