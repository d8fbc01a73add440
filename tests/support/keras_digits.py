"""A small Keras 3 classifier of scikit-learn's bundled digits on the PyTorch backend, and a
function trainable that fits it with popflow's Keras callback (``tests/test_keras.py``).

Imported by the tests that use it, not at collection (Keras and torch take seconds)."""

from __future__ import annotations

import os
from typing import Any

os.environ["KERAS_BACKEND"] = "torch"  # before keras is imported: no TensorFlow here

import keras
from sklearn.datasets import load_digits

from popflow import tune
from popflow.tune.integration.keras import TuneReportCheckpointCallback

EPOCHS = 4
BATCH = 200
STEPS = 1200 // BATCH  # optimizer steps per epoch


def data() -> tuple[Any, Any, Any, Any]:
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype("float32")
    return x[:1200], y[:1200], x[1200:], y[1200:]


def build(lr: float) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)]
    )
    model.compile(
        optimizer=keras.optimizers.SGD(lr),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def fit(config: dict[str, Any], **callback: Any) -> None:
    """Fit for ``EPOCHS`` epochs, from the model popflow hands back if any."""
    callback = {"metrics": {"loss": "val_loss", "acc": "val_accuracy"}, **callback}
    x, y, xv, yv = data()
    model, start = build(config["lr"]), 0
    if (checkpoint := tune.get_checkpoint()) is not None:
        model = TuneReportCheckpointCallback.get_model(checkpoint)
        start = int(model.optimizer.iterations) // STEPS
    model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=EPOCHS,
        initial_epoch=start,
        validation_data=(xv, yv),
        shuffle=False,
        verbose=0,
        callbacks=[TuneReportCheckpointCallback(**callback)],
    )
