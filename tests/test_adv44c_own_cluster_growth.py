"""``ResourceChangingScheduler`` on a Dask cluster of one's own whose workers declare
``CPU=2`` each (two workers: ``dask worker --nthreads 1 --resources CPU=2``). The allocation
functions see the workers' CPUs summed (4) and, once one trial is left, give it all 4; but a
trial is one slot on one worker, no worker has 4, and the run waits for ever (the only word:
"its segment has run for 60 s ... a step that never returns holds its slot"). Ray places
``add_bundles=True``'s extra bundles on other nodes, so the same script ends on Ray; with
Ray's default (one bundle) popflow hangs the same way. A trial must not be grown beyond what
one worker can hold."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
from popflow.tune.schedulers import DistributeResources


def trainable(config):
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            start = json.load(open(os.path.join(d, "s.json")))["i"]
    for i in range(start, config["n"]):
        held = tune.get_context().get_trial_resources().required_resources["CPU"]
        with tempfile.TemporaryDirectory() as d:
            json.dump({"i": i + 1}, open(os.path.join(d, "s.json"), "w"))
            tune.report({"score": i, "cpus": held}, checkpoint=Checkpoint.from_directory(d))


ray.init(address=sys.argv[2])
tuner = tune.Tuner(
    tune.with_resources(trainable, PlacementGroupFactory([{"CPU": 1}])),
    param_space={"n": tune.grid_search([2, 6])},
    tune_config=tune.TuneConfig(
        metric="score", mode="max",
        scheduler=ResourceChangingScheduler(
            FIFOScheduler(), DistributeResources(add_bundles=True)
        ),
    ),
    run_config=tune.RunConfig(storage_path=sys.argv[1], name="own", verbose=0),
)
grid = tuner.fit()
print("CPUS", [max(r.metrics_dataframe["cpus"]) for r in grid], "ERRORS", grid.num_errors)
"""


def test_a_trial_grows_no_larger_than_a_worker(tmp_path: Path) -> None:
    from distributed import LocalCluster

    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
        resources={"CPU": 2}, host="127.0.0.1",
    ) as cluster:  # fmt: skip
        try:
            done = subprocess.run(
                [sys.executable, str(script), str(tmp_path / "results"), cluster.scheduler_address],
                capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path,
            )  # fmt: skip
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"")[-2000:]
            raise AssertionError(f"the run did not end in 180 s: {out!r}") from None
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ERRORS 0" in done.stdout, done.stdout
    # each trial at most what one worker holds
    assert "4.0" not in done.stdout, done.stdout
