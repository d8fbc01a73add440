"""Adversary (issue 44, item 4): a function trial that reports checkpoints and then
raises, restored with ``Tuner.restore(..., resume_errored=True)``.

Ray 2.60 (the same script run on it): the errored trial's ``Result.checkpoint`` is the
last checkpoint it reported (``checkpoint_000001``, iteration 2), ``Result.error`` is an
exception (``RayTaskError(RuntimeError)``, an instance of ``RuntimeError``), and
``resume_errored=True`` goes on from that checkpoint (the function sees
``get_checkpoint()`` at iteration 2). popflow drops the checkpoints of the errored
segment: ``checkpoint`` is None, the error is a ``str``, and the resumed trial starts
again from scratch.
"""

from __future__ import annotations

import json
import os
import tempfile

import pytest

from popflow import tune

pytestmark = pytest.mark.integration


def _fails_once_at_three(config):
    checkpoint = tune.get_checkpoint()
    start = 0
    if checkpoint:
        with checkpoint.as_directory() as folder, open(os.path.join(folder, "s.json")) as f:
            start = json.load(f)["i"]
    for i in range(start, 5):
        if i == 2 and not os.path.exists(config["flag"]):
            open(config["flag"], "w").close()
            raise RuntimeError("boom")
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "s.json"), "w") as f:
                json.dump({"i": i + 1}, f)
            tune.report(
                {"score": i + 1, "start": start},
                checkpoint=tune.Checkpoint.from_directory(folder),
            )


@pytest.fixture
def errored(initialised, tmp_path):
    results = tune.Tuner(
        _fails_once_at_three,
        param_space={"flag": str(tmp_path / "failed-once")},
        run_config=tune.RunConfig(name="errck", storage_path=str(tmp_path / "r"), verbose=0),
    ).fit()
    return results


def test_an_errored_trials_result_keeps_its_last_checkpoint_and_an_exception(errored):
    result = errored[0]
    assert result.metrics["score"] == 2
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as folder, open(os.path.join(folder, "s.json")) as f:
        assert json.load(f)["i"] == 2
    assert isinstance(result.error, Exception)


def test_resume_errored_goes_on_from_the_last_checkpoint(errored):
    again = tune.Tuner.restore(
        errored.experiment_path, _fails_once_at_three, resume_errored=True
    ).fit()
    result = again[0]
    assert result.error is None
    assert result.metrics["training_iteration"] == 5
    assert result.metrics["start"] == 2  # restored from iteration 2's checkpoint
