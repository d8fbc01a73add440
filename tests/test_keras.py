"""Ray's Keras callback (``popflow.tune.integration.keras``), on Keras 3's PyTorch backend,
inside function trainables through the real driver on the simulated backend."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
from support.framework_runs import asha_spent, clone_at_2, simulate_lrs

pytestmark = [
    pytest.mark.unit,
    # Keras 3.15 on numpy 2 warns of __array__'s copy keyword on every variable it reads
    pytest.mark.filterwarnings("ignore::DeprecationWarning:keras"),
]


@pytest.fixture(scope="module")
def digits() -> Any:
    # Keras and torch import here, not at collection (tests/support/keras_digits.py)
    from support import keras_digits

    return keras_digits


def test_each_epoch_is_reported_renamed_with_the_model(tmp_path, digits):
    sim = simulate_lrs(tmp_path, digits.fit, [0.5, 0.05])
    for result in sim.grid:
        history = list(result.history)
        assert [r["training_iteration"] for r in history] == list(range(1, digits.EPOCHS + 1))
        assert all(0 < r["loss"] < 3 and 0 <= r["acc"] <= 1 for r in history)
        assert "val_loss" not in history[0]  # a dict renames
        model = digits.TuneReportCheckpointCallback.get_model(result.checkpoint)
        assert int(model.optimizer.iterations) == digits.EPOCHS * digits.STEPS
    losses = {r.config["lr"]: r.metrics["loss"] for r in sim.grid}
    assert losses[0.5] < losses[0.05]


def test_a_clone_resumes_the_donors_model_where_it_left_off(tmp_path, digits):
    """PBT clones the better trial's model (weights and optimizer) into the worse at epoch
    2; ``initial_epoch`` from the optimizer's step count goes on from there, so the clone's
    epochs 3 and 4 are the donor's to the last digit."""
    donor_h, clone_h = clone_at_2(tmp_path, digits.fit)
    assert len(clone_h) == digits.EPOCHS
    assert clone_h[1]["loss"] > donor_h[1]["loss"]
    assert clone_h[2]["loss"] == donor_h[2]["loss"] and clone_h[3]["loss"] == donor_h[3]["loss"]


def test_a_trial_the_scheduler_stops_unwinds_out_of_fit(tmp_path, digits):
    spent = asha_spent(tmp_path, digits.fit, digits.EPOCHS)
    assert spent[0] == 1 and spent[-1] == digits.EPOCHS


def test_metrics_without_checkpoints_and_a_missing_name(tmp_path, digits):
    """``checkpoint_on=[]`` reports without checkpoints; a list keeps Keras's names; a name
    the logs lack fails the trial, naming what they hold (Ray raises ``KeyError`` too)."""
    quiet = partial(digits.fit, checkpoint_on=[], metrics=["val_loss", "accuracy"])
    (result,) = simulate_lrs(tmp_path / "a", quiet, [0.5], metric="val_loss").grid
    assert len(list(result.history)) == digits.EPOCHS and result.checkpoint is None
    assert set(result.metrics) >= {"val_loss", "accuracy"} and "loss" not in result.metrics

    wrong = partial(digits.fit, metrics="val_acc")
    (result,) = simulate_lrs(tmp_path / "b", wrong, [0.5], metric="val_acc").grid
    assert "val_acc" in str(result.error) and "val_accuracy" in str(result.error)


def test_bad_callback_arguments_are_named(digits):
    from popflow.tune.integration.keras import TuneReportCallback, TuneReportCheckpointCallback

    with pytest.raises(ValueError, match="report_metrics_on"):
        TuneReportCheckpointCallback(report_metrics_on="validation_end")
    with pytest.raises(ValueError, match="checkpoint_on"):
        TuneReportCheckpointCallback(checkpoint_on=["epoch_end", "epoch"])
    with pytest.raises(TypeError, match="metrics"):
        TuneReportCheckpointCallback(metrics=3)
    with pytest.raises(DeprecationWarning, match="TuneReportCheckpointCallback"):
        TuneReportCallback()
