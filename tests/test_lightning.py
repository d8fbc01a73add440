"""Ray's PyTorch Lightning callbacks (``popflow.tune.integration.pytorch_lightning``)
inside function trainables, through the real driver on the simulated backend: a Lightning
``Trainer`` reports its validation metrics, hands its checkpoints to popflow, is unwound by
the scheduler and resumes from its checkpoint as a paused or cloned trial."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import pytest
from support.framework_runs import asha_spent, clone_at_2, simulate_lrs

import popflow

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def digits() -> Any:
    # torch and Lightning import here, not at collection (tests/support/lightning_digits.py)
    from support import lightning_digits

    return lightning_digits


def test_each_validation_epoch_is_reported_renamed_with_the_trainers_checkpoint(tmp_path, digits):
    sim = simulate_lrs(tmp_path, digits.fit, [0.5, 0.05])
    for result in sim.grid:
        history = list(result.history)
        # one result per epoch (the sanity check's validation reports nothing)
        assert [r["training_iteration"] for r in history] == list(range(1, digits.EPOCHS + 1))
        assert [r["epoch"] for r in history] == [float(e) for e in range(digits.EPOCHS)]
        assert all(0 < r["loss"] < 3 and 0 <= r["acc"] <= 1 for r in history)
        assert "val_loss" not in history[0]  # a dict renames
        with result.checkpoint.as_directory() as folder:
            saved = digits.torch.load(f"{folder}/{digits.FILENAME}", weights_only=False)
        assert saved["epoch"] == digits.EPOCHS - 1  # the last epoch's trainer state
    losses = {r.config["lr"]: r.metrics["loss"] for r in sim.grid}
    assert losses[0.5] < losses[0.05]  # the faster learner, after 4 epochs


def test_a_clone_resumes_the_donors_trainer_where_it_left_off(tmp_path, digits):
    """PBT clones the best trial's checkpoint into the worst at epoch 2: the clone's fit
    goes on from the donor's weights, optimizer and epoch count, so its third epoch is the
    donor's third, to the last digit."""
    donor_h, clone_h = clone_at_2(tmp_path, digits.fit)
    assert [r["epoch"] for r in clone_h] == [0.0, 1.0, 2.0, 3.0]
    assert clone_h[1]["loss"] > donor_h[1]["loss"]  # the worse one before the exploit
    assert clone_h[2]["loss"] == donor_h[2]["loss"] and clone_h[3]["loss"] == donor_h[3]["loss"]


def test_a_trial_the_scheduler_stops_unwinds_out_of_fit(tmp_path, digits):
    spent = asha_spent(tmp_path, digits.fit, digits.EPOCHS)
    assert spent[0] == 1 and spent[-1] == digits.EPOCHS


def test_hooks_metrics_and_checkpoints_as_asked(tmp_path, digits, caplog):
    """``on`` another hook; a metric Lightning never logged is left out with a warning (Ray
    does the same); ``save_checkpoints=False`` reports without checkpoints."""
    fit = partial(
        digits.fit,
        metrics=["train_loss", "no_such_metric"],
        on="train_epoch_end",
        save_checkpoints=False,
    )
    with caplog.at_level(logging.WARNING, logger="popflow.tasks.lightning_report"):
        sim = popflow.simulate(
            fit, {"lr": 0.5}, metric="train_loss", mode="min", storage=str(tmp_path)
        )
    (result,) = sim.grid
    history = list(result.history)
    assert len(history) == digits.EPOCHS and "loss" not in history[0]
    assert all("no_such_metric" not in r for r in history)
    assert "no_such_metric" in caplog.text
    assert result.checkpoint is None


def test_bad_callback_arguments_are_named(digits):
    from popflow.tune.integration.pytorch_lightning import (
        TuneReportCallback,
        TuneReportCheckpointCallback,
    )

    with pytest.raises(ValueError, match="validation_end"):
        TuneReportCheckpointCallback(on="validation_ends")
    with pytest.raises(TypeError, match="metrics"):
        TuneReportCheckpointCallback(metrics=3)
    with pytest.raises(ValueError, match="filename"):
        TuneReportCheckpointCallback(filename="sub/trainer.ckpt")
    with pytest.warns(DeprecationWarning, match="save_checkpoints=False"):
        TuneReportCallback("val_loss")
