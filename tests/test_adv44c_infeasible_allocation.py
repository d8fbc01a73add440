"""A resources allocation function that asks for more than the cluster has
(``PlacementGroupFactory([{"CPU": 64}])`` on ``popflow.init(num_cpus=2)``). popflow's
``ResourceChangingScheduler`` says "the first always starts, so a trial larger than the
cluster cannot wait for ever", yet the run waited for ever: the trials paused to grow and
no Dask slot of 64 CPUs ever came, and the only word in two minutes was "its segment has
run for 60 s ... a step that never returns holds its slot", which points at the user's
step. Ray 2.60 waits too but says why ("You asked for 64 CPUs and 0 GPUs per trial, but
the cluster only has 2 CPUs"). Either the run ends (the trial errored, naming what it
asked for) or the script is told what it asked for beside what the cluster has."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support.polling import wait_for

pytestmark = pytest.mark.integration

SCRIPT = """
import json
import os
import sys
import tempfile

import popflow as ray
from popflow import tune
from popflow.tune import Checkpoint, PlacementGroupFactory
from popflow.tune.schedulers import FIFOScheduler, ResourceChangingScheduler


def trainable(config):
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            start = json.load(open(os.path.join(d, "s.json")))["i"]
    for i in range(start, 4):
        with tempfile.TemporaryDirectory() as d:
            json.dump({"i": i + 1}, open(os.path.join(d, "s.json"), "w"))
            tune.report({"score": i}, checkpoint=Checkpoint.from_directory(d))


def allocate(tune_controller, trial, result, scheduler):
    if result["training_iteration"] < 2:
        return None
    return PlacementGroupFactory([{"CPU": 64}])


ray.init(num_cpus=2)
tuner = tune.Tuner(
    tune.with_resources(trainable, {"CPU": 1}),
    param_space={"x": tune.grid_search([1, 2])},
    tune_config=tune.TuneConfig(
        metric="score", mode="max",
        scheduler=ResourceChangingScheduler(FIFOScheduler(), allocate),
    ),
    run_config=tune.RunConfig(storage_path=sys.argv[1], name="big", verbose=0),
)
try:
    grid = tuner.fit()
    print("ERRORS", [str(r.error) for r in grid])
except Exception as e:
    print("RAISED", e)
print("ENDED", flush=True)
"""


def test_an_allocation_larger_than_the_cluster_is_said(tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "results")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
    reader.start()

    def told() -> bool:
        text = "".join(lines)
        ended = "ENDED" in text
        # what it asked for, beside what the cluster has
        named = "64" in text and ("2 CPU" in text or "'CPU': 2" in text)
        return named or (ended and "64" in text)

    try:
        wait_for(told, timeout_s=150, what="the run ended or named the 64 CPUs asked for")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        reader.join(timeout=10)
