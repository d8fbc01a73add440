"""Adversary (issue 44, item 2): ``run_budget_s`` shorter than one segment.

A run stopped at its ``run_budget_s`` says "go on with: popflow resume ... --run-budget-s
T (T s more ...)", promising progress. But the segments in flight are cancelled with
their results and checkpoints not taken, so where a trial's segment is longer than the
budget (any function trainable under FIFO: one segment is the whole trial) every resume
spends its budget and keeps nothing, for ever, though the trainable reported (and
checkpointed) many times. Seen with ``popflow resume --run-budget-s 4`` on a Tuner
experiment: each resume ends "2 trials to go" with the trials still PENDING at 0
iterations.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import pytest

from popflow import run, tune

pytestmark = pytest.mark.integration


def _checkpoints_every_report(config):
    checkpoint = tune.get_checkpoint()
    start = 0
    if checkpoint:
        with checkpoint.as_directory() as folder, open(os.path.join(folder, "s.json")) as f:
            start = json.load(f)["i"]
    for i in range(start, 200):
        time.sleep(0.1)  # the work of one iteration
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "s.json"), "w") as f:
                json.dump({"i": i + 1}, f)
            tune.report({"i": i + 1}, checkpoint=tune.Checkpoint.from_directory(folder))


def test_resumes_under_a_short_run_budget_make_progress(prefect_server, dask_cluster, tmp_path):
    kwargs = {
        "storage": str(tmp_path / "r"),
        "name": "budgeted",
        "dask_address": dask_cluster,
        "run_budget_s": 3,
        "verbose": 0,
    }
    run(_checkpoints_every_report, {"x": 1}, **kwargs)
    results = run(_checkpoints_every_report, {"x": 1}, resume="auto", **kwargs)
    # two runs of 3 s each, with a report and a checkpoint every 0.1 s: some kept
    assert (results[0].metrics or {}).get("training_iteration", 0) > 0
