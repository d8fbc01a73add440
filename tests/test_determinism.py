"""A seeded synchronous PBT run repeats bit for bit, with 1 worker and with 2."""

from __future__ import annotations

import json
import os
import sys

import cloudpickle
import pytest

from popflow import CheckpointConfig, run
from popflow.schedulers import PopulationBasedTraining
from popflow.tasks.progress import comparable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import pbt_benchmark

pytestmark = pytest.mark.integration

# workers started before this import cannot import the example module: ship it by value
cloudpickle.register_pickle_by_value(pbt_benchmark)


def run_benchmark(storage: str, name: str, workers: int) -> tuple[str, list]:
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=5,
        hyperparam_mutations={
            "lr": lambda: __import__("random").uniform(0.0001, 0.02),
            "some_other_factor": [1, 2],
        },
        synch=True,
    )
    results = run(
        pbt_benchmark.PBTBenchmarkExample,
        param_space={"lr": 0.0001, "some_other_factor": 1},
        scheduler=pbt,
        metric="mean_accuracy",
        mode="max",
        num_samples=8,
        stop={"done": True, "training_iteration": 1000},
        checkpoint_config=CheckpointConfig(
            checkpoint_frequency=5, checkpoint_score_attribute="mean_accuracy", num_to_keep=4
        ),
        storage=storage,
        name=name,
        seed=0,
        n_workers=workers,
    )
    with open(os.path.join(results.experiment_path, "pbt_global.txt")) as f:
        policy = f.read()
    finals = [
        (r.config, comparable(r.metrics), [comparable(h) for h in r.history]) for r in results
    ]
    return policy, json.loads(json.dumps(finals))


@pytest.mark.parametrize("workers", [1, 2])
def test_synch_pbt_benchmark_is_reproducible(prefect_server, tmp_path, workers):
    first = run_benchmark(str(tmp_path / "first"), "bench", workers)
    second = run_benchmark(str(tmp_path / "second"), "bench", workers)
    assert first[0] and first[0].count("\n") > 10  # many exploits happened
    assert first == second
    if workers == 2:  # the same as with one worker too
        third = run_benchmark(str(tmp_path / "third"), "bench", 1)
        assert third == first
