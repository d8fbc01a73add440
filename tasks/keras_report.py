"""Ray's ``ray.tune.integration.keras.TuneReportCheckpointCallback``: a Keras callback
that reports ``model.fit``'s logs to popflow (at ``epoch_end`` by default), with the model
saved as ``model.keras`` in the checkpoint.

    def train(config):
        model, start = build(config), 0
        if (checkpoint := tune.get_checkpoint()) is not None:
            model = TuneReportCheckpointCallback.get_model(checkpoint)
            start = int(model.optimizer.iterations) // steps_per_epoch
        model.fit(x, y, epochs=10, initial_epoch=start, validation_data=(xv, yv),
                  callbacks=[TuneReportCheckpointCallback({"loss": "val_loss"})])

Keras 3 on any backend (Ray's needs TensorFlow): ``KERAS_BACKEND=torch`` runs it on
PyTorch. When the scheduler ends the segment there, ``report`` unwinds ``model.fit``; the
next segment gets the checkpoint of the last report. Needs ``keras``:
``pip install 'popflow[keras]'``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

try:
    import keras
except ModuleNotFoundError as e:
    if e.name == "keras":
        raise ImportError("Keras's callback needs keras: pip install 'popflow[keras]'") from None
    # Keras 3 imports its backend (KERAS_BACKEND, TensorFlow by default) on import
    raise ImportError(
        f"keras imports its backend's module {e.name!r}, which is not installed: set "
        "KERAS_BACKEND=torch (or jax) in the environment, or install that backend"
    ) from e

from popflow.tasks.boosting_reports import pick
from popflow.tasks.checkpoint import Checkpoint
from popflow.tasks.function_api import report

#: The hooks ``checkpoint_on`` and ``report_metrics_on`` name (Keras's, less the ``on_``)
HOOKS = (
    "epoch_begin", "epoch_end", "train_batch_begin", "train_batch_end", "test_batch_begin",
    "test_batch_end", "predict_batch_begin", "predict_batch_end", "train_begin", "train_end",
    "test_begin", "test_end", "predict_begin", "predict_end",
)  # fmt: skip

MODEL_FILENAME = "model.keras"


class TuneReportCheckpointCallback(keras.callbacks.Callback):
    """Reports ``metrics`` of Keras's logs (all if None; a list keeps those names, a dict
    renames ``{reported: Keras's}``; a name the logs lack raises ``KeyError`` naming what
    they hold) at each hook in ``report_metrics_on``, and with the model saved at each hook
    in ``checkpoint_on`` (a checkpoint always carries the metrics, as Ray)."""

    def __init__(
        self,
        checkpoint_on: str | list[str] = "epoch_end",
        report_metrics_on: str | list[str] = "epoch_end",
        metrics: str | list[str] | dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self._checkpoint_on = _hooks("checkpoint_on", checkpoint_on)
        self._report_on = _hooks("report_metrics_on", report_metrics_on)
        if isinstance(metrics, str):
            metrics = [metrics]
        if metrics is not None and not isinstance(metrics, list | dict):
            raise TypeError(f"`metrics` is {metrics!r}, but must be a name, a list or a dict")
        self._metrics = metrics

    @staticmethod
    def get_model(checkpoint: Checkpoint) -> Any:
        """The model (with its optimizer's state) a checkpoint of this callback holds."""
        with checkpoint.as_directory() as folder:
            return keras.models.load_model(Path(folder, MODEL_FILENAME))

    def _handle(self, when: str, logs: dict[str, Any] | None) -> None:
        if when not in self._checkpoint_on and when not in self._report_on:
            return
        metrics = pick({k: _number(v) for k, v in (logs or {}).items()}, self._metrics, None)
        if when not in self._checkpoint_on:
            report(metrics)
            return
        with tempfile.TemporaryDirectory() as folder:
            self.model.save(Path(folder, MODEL_FILENAME))
            report(metrics, checkpoint=Checkpoint.from_directory(folder))

    # Keras calls each hook with its own leading argument (an epoch or batch index) or none
    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._handle("epoch_begin", logs)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._handle("epoch_end", logs)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._handle("train_batch_begin", logs)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._handle("train_batch_end", logs)

    def on_test_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._handle("test_batch_begin", logs)

    def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._handle("test_batch_end", logs)

    def on_predict_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._handle("predict_batch_begin", logs)

    def on_predict_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._handle("predict_batch_end", logs)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._handle("train_begin", logs)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._handle("train_end", logs)

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._handle("test_begin", logs)

    def on_test_end(self, logs: dict[str, Any] | None = None) -> None:
        self._handle("test_end", logs)

    def on_predict_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._handle("predict_begin", logs)

    def on_predict_end(self, logs: dict[str, Any] | None = None) -> None:
        self._handle("predict_end", logs)


class TuneReportCallback:
    """Removed in Ray 2 (its construction raises there too)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        raise DeprecationWarning(
            "ray.tune.integration.keras.TuneReportCallback is deprecated (as in Ray): use "
            "TuneReportCheckpointCallback(checkpoint_on=[], metrics=...) to report without "
            "checkpoints"
        )


def _hooks(argument: str, value: str | list[str]) -> frozenset[str]:
    hooks = [value] if isinstance(value, str) else list(value)
    unknown = [hook for hook in hooks if hook not in HOOKS]
    if unknown:
        raise ValueError(f"`{argument}` names {unknown}, but must be Keras hooks of {list(HOOKS)}")
    return frozenset(hooks)


def _number(value: Any) -> Any:
    # Keras logs Python floats on some backends and 0-d tensors or arrays on others
    return value.item() if hasattr(value, "item") else value
