"""Ray's FAQ: ``np.random.seed(1234)`` before ``Tuner(...)`` makes random search give the
same configs run after run ("If you remove this line, you will get different
configurations each time"). Without ``seed=``, popflow's experiment seed is drawn from
numpy's global state in the script's process, so the same holds: for the domains, for
``sample_from`` functions that use ``np.random``, with and without an explicit
``BasicVariantGenerator``. Each run is a fresh process, as a user's script is.
"""

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
import sys

import numpy as np

import popflow
from popflow import tune
from popflow.tune.search import BasicVariantGenerator

if sys.argv[1] == "seeded":
    np.random.seed(1234)


def train(config):
    tune.report({"score": config["a"]})


space = {
    "a": tune.uniform(0, 1),
    "b": tune.qlograndint(1, 10**6, 1),
    "c": tune.sample_from(lambda spec: int(np.random.randint(0, 10**6))),
}
out = {}
for name, search_alg in (("default", None), ("searcher", BasicVariantGenerator())):
    grid = popflow.run(
        train, space, search_alg=search_alg, num_samples=3, metric="score", mode="max",
        storage=sys.argv[2], name=name, dask_address=sys.argv[3], verbose=0,
    )
    out[name] = sorted(
        [r.config["a"], r.config["b"], r.config["c"]] for r in grid
    )
print("CONFIGS " + json.dumps(out))
"""


def configs(tmp_path: Path, run: str, seeded: bool, address: str) -> dict[str, list]:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    storage = tmp_path / run
    proc = subprocess.run(
        [sys.executable, str(script), "seeded" if seeded else "unseeded", str(storage), address],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ.copy(),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("CONFIGS "))
    return json.loads(line.removeprefix("CONFIGS "))


def test_a_seeded_script_repeats_its_configs_and_an_unseeded_one_does_not(
    prefect_server, dask_cluster, tmp_path
):
    address = dask_cluster.scheduler.address
    first = configs(tmp_path, "first", True, address)
    second = configs(tmp_path, "second", True, address)
    assert first == second
    assert len(first["default"]) == len(first["searcher"]) == 3
    unseeded = [configs(tmp_path, f"unseeded{i}", False, address) for i in range(2)]
    for name in ("default", "searcher"):
        assert unseeded[0][name] != unseeded[1][name]
        assert unseeded[0][name] != first[name]
