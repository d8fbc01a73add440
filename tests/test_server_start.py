"""``popflow server start``: popflow's local Prefect server for deployments and workers,
started once per ``PREFECT_HOME`` and found again by a second ``start``; and the flow
example's ``--run`` on that one server (its flow run and its ``tune`` subflow together)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.polling import wait_for
from support.prefect_api import api

from popflow.infra import local_server

ROOT = Path(__file__).resolve().parent.parent


def popflow(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PREFECT_HOME": str(home)}
    env.pop("PREFECT_API_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "popflow.flows.api.cli", "server", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def answers(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def alive(pid: int) -> bool:
    """``pid`` runs (a zombie does not: the suite adopts and reaps orphans, in its time)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.integration
def test_start_waits_prints_the_export_line_and_a_second_start_reuses(tmp_path: Path) -> None:
    home = tmp_path / "prefect-home"
    first = popflow(home, "start")
    assert first.returncode == 0, first.stderr
    record = json.loads((home / local_server.RECORD).read_text())
    url = f"http://127.0.0.1:{record['port']}/api"
    # stdout is the one line a shell evaluates; it answers already (start waited)
    assert first.stdout == f"export PREFECT_API_URL={url}\n"
    assert answers(url)
    assert f"Prefect UI: http://127.0.0.1:{record['port']}" in first.stderr
    assert "started" in first.stderr

    again = popflow(home, "start")  # idempotent: the same server, found, not a second one
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout
    assert "already running" in again.stderr
    assert json.loads((home / local_server.RECORD).read_text())["pid"] == record["pid"]

    # the exported line works as written
    shell = subprocess.run(
        ["bash", "-c", f'eval "$({sys.executable} -m popflow.flows.api.cli server start)"; '
         'echo "$PREFECT_API_URL"'],
        env={**os.environ, "PREFECT_HOME": str(home)},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert shell.returncode == 0 and shell.stdout == f"{url}\n", shell.stderr

    status = popflow(home, "status")
    assert status.returncode == 0 and f"Prefect UI: http://127.0.0.1:{record['port']}" in (
        status.stdout
    )
    moved = popflow(home, "start", "--port", str(record["port"] + 1))
    assert moved.returncode == 2
    assert moved.stderr.strip().splitlines() == [
        f"popflow: the local Prefect server of {home} runs on port {record['port']}, not "
        f"{record['port'] + 1} (`popflow server stop` first to move it)"
    ]

    # a server that died: the next start starts a new one
    os.killpg(record["pid"], signal.SIGKILL)
    wait_for(lambda: not local_server.running(home), 30, "the killed server gone")
    revived = popflow(home, "start")
    assert revived.returncode == 0, revived.stderr
    new = json.loads((home / local_server.RECORD).read_text())
    assert new["pid"] != record["pid"] and "started" in revived.stderr
    assert answers(f"http://127.0.0.1:{new['port']}/api")

    stopped = popflow(home, "stop")
    assert stopped.returncode == 0 and f"pid {new['pid']}" in stopped.stdout
    assert not alive(new["pid"]) and not (home / local_server.RECORD).exists()
    assert "no local Prefect server" in popflow(home, "status").stdout


@pytest.mark.integration
def test_start_on_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = popflow(tmp_path / "prefect-home", "start", "--port", str(port))
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"popflow: port {port} of 127.0.0.1 is in use: choose another, or none"
    ]
    assert refused.stdout == ""


@pytest.mark.system
def test_the_flow_example_runs_on_one_server_without_errors(tmp_path: Path) -> None:
    """``pbt_benchmark_flow.py --run``: the parent flow run and its ``tune`` subflow on
    popflow's local server (it started Prefect's temporary server for the parent, and its
    telemetry printed an ERROR)."""
    home = tmp_path / "prefect-home"
    env = {**os.environ, "PREFECT_HOME": str(home)}
    for name in ("PREFECT_API_URL", local_server.MODE_VARIABLE):
        env.pop(name, None)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "pbt_benchmark_flow.py"), "--run",
         "--smoke-test", "--storage", str(tmp_path / "results")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "temporary server" not in output, output[-3000:]
    assert "ERROR" not in output, output[-3000:]
    server = local_server.running(home)
    assert server is not None
    from prefect.settings import PREFECT_API_URL, temporary_settings

    async def runs(client: Any) -> dict[str, Any]:
        found = await client.read_flow_runs()
        by_flow = {}
        for run in found:
            flow = await client.read_flow(run.flow_id)
            by_flow[flow.name] = run
        parent_task = await client.read_task_run(by_flow["tune"].parent_task_run_id)
        return {**by_flow, "tune's parent": parent_task.flow_run_id}

    with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
        found = api(runs)
    assert found["pbt-benchmark"].state.is_completed()
    assert found["tune"].state.is_completed()
    assert found["tune's parent"] == found["pbt-benchmark"].id


@pytest.mark.system
def test_status_says_where_runs_report_when_the_shell_names_another_server(tmp_path: Path) -> None:
    """A PREFECT_API_URL left in the shell sends every run elsewhere: `popflow server` said
    only that the local server was not running (found by issue 43's adversarial pass)."""
    env = {**os.environ, "PREFECT_HOME": str(tmp_path), "PREFECT_API_URL": "http://127.0.0.1:9/api"}
    out = subprocess.run(
        [sys.executable, "-m", "popflow.flows.api.cli", "server"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "no local Prefect server" in out.stdout
    assert (
        "PREFECT_API_URL is http://127.0.0.1:9/api: runs started from this shell report there"
        in out.stderr
    )
    assert "note:" not in popflow(tmp_path).stderr  # without it: nothing to note
