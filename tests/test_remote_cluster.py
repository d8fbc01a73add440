"""A cluster of its own (``dask scheduler`` and ``dask worker`` processes) whose workers
cannot import the user's code: popflow sends the trainable's module, and code it still
cannot load fails the run at once with one clear error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.polling import wait_for

pytestmark = pytest.mark.system

DASK = Path(sys.executable).with_name("dask")

USERMOD = """
import os
from popflow import tune

def train(config):
    for i in range(3):
        tune.report({
            "score": (i + 1) * config["x"],
            "cwd": os.getcwd(),
            "devices": os.environ.get("CUDA_VISIBLE_DEVICES", "unset"),
        })
"""

HELPERS = """
class Scale:
    def __init__(self, factor):
        self.factor = factor
"""

DRIVER = """
import sys
from popflow import run
from usermod import train

address, case = sys.argv[1], sys.argv[2]
config = {"x": 2}
if case == "unloadable":  # an object from a second local module: not sent by value
    from helpers import Scale
    config["scale"] = Scale(3)
gpu = {"resources_per_trial": {"gpu": 1}, "num_samples": 3} if case == "gpu" else {}
try:
    grid = run(train, config, storage="results", name=case, dask_address=address, **gpu)
except Exception as e:
    print("RAISED", type(e).__name__, str(e).splitlines()[0][:400])
    raise SystemExit(3)
print("SCORES", [r.metrics["score"] for r in grid], grid[0].metrics["cwd"])
print("WHERE", sorted({(r.metrics["cwd"], r.metrics["devices"]) for r in grid}))
"""


@pytest.fixture
def own_cluster(tmp_path) -> Iterator[str]:
    """``dask scheduler`` and two ``dask worker`` processes on 127.0.0.1, one offering
    ``GPU=1`` and one CPU-only, each in a folder of its own (``worker/gpu``,
    ``worker/cpu``) with nothing of the user's code on its path."""
    scheduler_file = tmp_path / "scheduler.json"
    worker_dir = tmp_path / "worker"
    worker_dir.mkdir()
    for kind in ("gpu", "cpu"):
        (worker_dir / kind).mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    procs = [
        subprocess.Popen(
            [str(DASK), "scheduler", "--host", "127.0.0.1", "--port", "0",
             "--dashboard-address", ":0", "--scheduler-file", str(scheduler_file)],
            cwd=worker_dir, env=env, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
    ]  # fmt: skip
    try:

        def listening() -> bool:  # the scheduler writes the file when it listens
            assert procs[0].poll() is None, "dask scheduler exited"
            return scheduler_file.exists() and bool(scheduler_file.read_text().strip())

        wait_for(listening, 60, "the dask scheduler to start")
        address = json.loads(scheduler_file.read_text())["address"]
        for kind, extra in (("gpu", ["--resources", "GPU=1"]), ("cpu", [])):
            procs.append(
                subprocess.Popen(
                    [str(DASK), "worker", address, "--nthreads", "1", "--nworkers", "1",
                     "--host", "127.0.0.1", "--local-directory", str(worker_dir / kind), *extra],
                    cwd=worker_dir / kind, env=env, start_new_session=True,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )
            )  # fmt: skip
        from distributed import Client

        with Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=60)
        yield address
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=30)


def drive(tmp_path: Path, address: str, case: str) -> subprocess.CompletedProcess:
    driver_dir = tmp_path / "driver"
    driver_dir.mkdir(exist_ok=True)
    (driver_dir / "usermod.py").write_text(textwrap.dedent(USERMOD))
    (driver_dir / "helpers.py").write_text(textwrap.dedent(HELPERS))
    (driver_dir / "driver.py").write_text(textwrap.dedent(DRIVER))
    return subprocess.run(
        [sys.executable, "driver.py", address, case],
        cwd=driver_dir,
        env=dict(os.environ),  # the session's Prefect server
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_workers_without_the_users_code_run_it_and_unloadable_code_fails_at_once(
    prefect_server, own_cluster, tmp_path
):
    ok = drive(tmp_path, own_cluster, "shipped")
    assert ok.returncode == 0, (ok.stdout + ok.stderr)[-3000:]
    line = next(x for x in ok.stdout.splitlines() if x.startswith("SCORES"))
    assert line.startswith("SCORES [6]") and line.rsplit("/", 2)[-2:] in (
        ["worker", "gpu"],
        ["worker", "cpu"],
    )
    # GPU trials: only on the GPU worker, each seeing its device
    gpu = drive(tmp_path, own_cluster, "gpu")
    assert gpu.returncode == 0, (gpu.stdout + gpu.stderr)[-3000:]
    where = next(x for x in gpu.stdout.splitlines() if x.startswith("WHERE"))
    assert where == f"WHERE {[(str(tmp_path / 'worker' / 'gpu'), '0')]}"
    bad = drive(tmp_path, own_cluster, "unloadable")
    assert bad.returncode == 3, (bad.stdout + bad.stderr)[-3000:]
    raised = next(x for x in bad.stdout.splitlines() if x.startswith("RAISED"))
    assert raised.startswith("RAISED CodeUnavailable")
    assert "No module named 'helpers'" in raised
    assert "The Dask workers cannot load the trials' code" in raised
