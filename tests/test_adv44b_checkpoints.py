"""Adversary (issue 44, item 6): checkpoints a Ray user writes, reads back and copies.

Checked on Ray 2.60 with the same script: a function trainable that reports a
checkpoint at iterations 1 and 2, then raises once, with
``FailureConfig(max_failures=2)``, is restored from the checkpoint of iteration 2
(Ray logs "Restored ... from checkpoint: .../checkpoint_000001" and the function's
``get_checkpoint()`` gives it); popflow retried it from the start, with no checkpoint.

And ``Checkpoint.to_directory()`` of a published checkpoint copies popflow's own
manifest into the user's folder, so ``set_metadata`` on that copy is refused as "published"
(the refusal's own advice: ``Checkpoint.from_directory(checkpoint.to_directory())``).
"""

from __future__ import annotations

import os
import tempfile

import pytest

from popflow import train, tune

pytestmark = pytest.mark.integration


def _crashes_once_after_two_checkpoints(config):
    checkpoint = train.get_checkpoint()
    start = checkpoint.get_metadata()["step"] if checkpoint else 0
    for i in range(start, 4):
        folder = tempfile.mkdtemp()
        with open(os.path.join(folder, "w.txt"), "w") as f:
            f.write(str(i))
        ckpt = train.Checkpoint.from_directory(folder)
        ckpt.set_metadata({"step": i + 1})
        train.report({"score": i, "started_at": start}, checkpoint=ckpt)
        if i == 1 and not os.path.exists(config["mark"]):
            open(config["mark"], "w").close()
            raise RuntimeError("boom")


def test_a_failed_trial_is_retried_from_its_latest_checkpoint(initialised, tmp_path):
    results = tune.Tuner(
        _crashes_once_after_two_checkpoints,
        param_space={"mark": str(tmp_path / "crashed")},
        run_config=tune.RunConfig(
            name="retry",
            storage_path=str(tmp_path / "results"),
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=2),
        ),
    ).fit()
    assert results.errors == []
    result = results[0]
    assert result.checkpoint.get_metadata() == {"step": 4}
    # Ray: the retry got the checkpoint of iteration 2 and went on from there
    assert result.metrics["started_at"] == 2


def _reports_one(config):
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "w.txt"), "w") as f:
        f.write("w")
    ckpt = train.Checkpoint.from_directory(folder)
    ckpt.set_metadata({"step": 1})
    train.report({"score": 1}, checkpoint=ckpt)


def test_a_copy_of_a_published_checkpoint_is_the_users_to_change(initialised, tmp_path):
    results = tune.Tuner(
        _reports_one,
        param_space={},
        run_config=tune.RunConfig(name="copy", storage_path=str(tmp_path / "r"), verbose=0),
    ).fit()
    published = results[0].checkpoint
    copy = train.Checkpoint.from_directory(published.to_directory(str(tmp_path / "copy")))
    # Ray's to_directory gives the checkpoint's files: the user's and the metadata
    assert sorted(os.listdir(copy.path)) == [".metadata.json", "w.txt"]
    copy.update_metadata({"note": "mine"})
    assert copy.get_metadata() == {"step": 1, "note": "mine"}
