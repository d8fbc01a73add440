"""``examples/digits_mlp.py``, the real-model example: it learns, checkpoints ``.npz``
files (no pickles), restores them exactly, and PBT changes its config in place."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import cloudpickle
import digits_mlp

cloudpickle.register_pickle_by_value(digits_mlp)  # the workers need not find examples/

CONFIG = {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4}


@pytest.mark.unit
def test_an_epoch_learns_and_a_checkpoint_restores_exactly(tmp_path):
    np.random.seed(0)
    model = digits_mlp.DigitsMLP(CONFIG)
    first = model.step()
    assert 0.5 < first["mean_accuracy"] <= 1.0 and first["val_loss"] > 0
    model.save_checkpoint(str(tmp_path))
    assert os.listdir(tmp_path) == ["model.npz"]
    with np.load(tmp_path / "model.npz", allow_pickle=False) as data:  # plain arrays only
        assert {"w1", "b1", "w2", "b2", "v_w1", "rng"} <= set(data.files)
    expected = model.step()
    again = digits_mlp.DigitsMLP(CONFIG)
    again.load_checkpoint(str(tmp_path))
    assert again.step() == expected  # weights, momentum and shuffling all restored


@pytest.mark.unit
def test_reset_config_changes_the_optimiser_in_place():
    np.random.seed(0)
    model = digits_mlp.DigitsMLP(CONFIG)
    assert model.reset_config({**CONFIG, "lr": 0.01})
    assert (model.lr, model.config["lr"]) == (0.01, 0.01)


@pytest.mark.integration
def test_pbt_tunes_the_mlp(tune_env):
    results = digits_mlp.tune_digits("pbt", num_samples=4, epochs=6, interval=2, seed=0,
                                     **tune_env)  # fmt: skip
    best = results.get_best_result()
    assert results.num_errors == 0
    assert best.metrics["mean_accuracy"] > 0.9 and best.metrics["training_iteration"] == 6
    assert "model.npz" in os.listdir(best.checkpoint.path)


@pytest.mark.unit
def test_an_unknown_scheduler_is_refused():
    with pytest.raises(ValueError, match="must be pbt, pb2, asha or random"):
        digits_mlp.make_scheduler("bohb", 10, 2)
