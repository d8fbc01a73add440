"""Real services for the integration tests: a Prefect server and a Dask LocalCluster."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_healthy(url: str, proc: subprocess.Popen, timeout: float = 180.0) -> None:
    """Poll the server's health endpoint until it answers (readiness, not a fixed sleep)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prefect server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"prefect server at {url} not healthy after {timeout}s")


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[str]:
    """``prefect server start`` on 127.0.0.1 with its own home; the session's flows report to it."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    home = tempfile.mkdtemp(prefix="popflow-prefect-")
    port = free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": home,
        "PREFECT_SERVER_API_HOST": "127.0.0.1",
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
    }
    env.pop("PREFECT_API_URL", None)
    log = open(os.path.join(home, "server.log"), "wb")  # noqa: SIM115 (lives as long as the server)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prefect",
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    try:
        wait_until_healthy(url, proc)
        with temporary_settings(updates={PREFECT_API_URL: url}):
            os.environ["PREFECT_API_URL"] = url  # for subprocesses the tests start
            yield url
    finally:
        from prefect.logging.handlers import APILogWorker

        APILogWorker.drain_all(timeout=5)  # ship queued flow logs before the server goes away
        os.environ.pop("PREFECT_API_URL", None)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture(scope="session")
def dask_cluster():
    """One LocalCluster of 2 process workers shared by the integration tests."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    )
    client = Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


@pytest.fixture
def tune_env(prefect_server, dask_cluster, tmp_path):
    """Keyword arguments that point ``tune`` at the test services and a fresh folder."""
    return {"dask_address": dask_cluster, "storage": str(tmp_path / "results")}
