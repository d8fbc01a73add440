"""``ResourceChangingScheduler(PopulationBasedTraining(...))``: Ray grows a trial's CPUs under
PBT as under FIFO (Ray 2.60, 3 trials on ``ray.init(num_cpus=4)``: the longest trial reached
4 CPUs, another 2). On popflow every result of every trial reported 1 CPU, with PBT
asynchronous or synchronous, where FIFO, ASHA and HyperBand grow them. Two trials on four
CPUs: DistributeResources gives each 2 from its first result on."""

from __future__ import annotations

import json
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
from popflow.tune.schedulers import PopulationBasedTraining, ResourceChangingScheduler
from popflow.tune.schedulers import DistributeResources


def trainable(config):
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d:
            start = json.load(open(os.path.join(d, "s.json")))["i"]
    for i in range(start, 6):
        held = tune.get_context().get_trial_resources().required_resources["CPU"]
        with tempfile.TemporaryDirectory() as d:
            json.dump({"i": i + 1}, open(os.path.join(d, "s.json"), "w"))
            tune.report(
                {"score": i * config["lr"], "cpus": held},
                checkpoint=Checkpoint.from_directory(d),
            )


pbt = PopulationBasedTraining(
    perturbation_interval=2,
    synch=sys.argv[2] == "sync",
    hyperparam_mutations={"lr": [0.1, 0.2, 0.3]},
)
ray.init(num_cpus=4)
tuner = tune.Tuner(
    tune.with_resources(trainable, PlacementGroupFactory([{"CPU": 1}])),
    param_space={"lr": tune.grid_search([0.1, 0.2])},
    tune_config=tune.TuneConfig(
        metric="score", mode="max",
        scheduler=ResourceChangingScheduler(pbt, DistributeResources()),
    ),
    run_config=tune.RunConfig(storage_path=sys.argv[1], name="pbt", verbose=0),
)
out = [list(r.metrics_dataframe["cpus"]) for r in tuner.fit()]
print("CPUS " + json.dumps(out))
"""


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_pbt_as_base_grows_trials(tmp_path: Path, mode: str) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "results"), mode],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("CPUS "))
    cpus = json.loads(line[len("CPUS ") :])
    # each trial's first result is on 1 CPU; from its second on it holds 2 (or more once the other
    # ended), as in Ray
    assert all(max(trial) >= 2.0 for trial in cpus), cpus
