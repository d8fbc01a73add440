"""Ray's ``ray.tune.integration.pytorch_lightning`` callbacks: a PyTorch Lightning
``Callback`` that reports the trainer's logged metrics to popflow at chosen hooks
(``validation_end`` by default), each report with the trainer's checkpoint.

    def train(config):
        trainer = pl.Trainer(max_epochs=10, enable_progress_bar=False, callbacks=[
            TuneReportCheckpointCallback({"loss": "val_loss"}, filename="trainer.ckpt")])
        checkpoint = tune.get_checkpoint()
        with (checkpoint.as_directory() if checkpoint else nullcontext()) as folder:
            trainer.fit(model, data, ckpt_path=folder and f"{folder}/trainer.ckpt")

The callback runs inside the user's function on its worker, as Ray's does: when the
scheduler ends the segment there (a pause, an ASHA stop, a PBT clone), ``report`` unwinds
``trainer.fit`` (Lightning tears the trainer down and re-raises), and the next segment
resumes from the checkpoint reported with the last result. Needs ``lightning`` (or the
older ``pytorch_lightning``): ``pip install 'popflow[lightning]'``.
"""

from __future__ import annotations

import inspect
import logging
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

try:
    from lightning.pytorch import Callback, Trainer
except ModuleNotFoundError as e:
    if e.name not in ("lightning", "lightning.pytorch"):
        raise
    try:  # the package's name before Lightning 2.0
        from pytorch_lightning import Callback, Trainer
    except ModuleNotFoundError as e:
        if e.name != "pytorch_lightning":
            raise
        raise ImportError(
            "Lightning's callback needs lightning: pip install 'popflow[lightning]'"
        ) from None

from popflow.tasks.checkpoint import Checkpoint
from popflow.tasks.function_api import report

logger = logging.getLogger(__name__)

#: Every hook the installed Lightning's ``Callback`` has, less the ``on_``: what ``on`` names
HOOKS = frozenset(
    name.removeprefix("on_")
    for name, _ in inspect.getmembers(Callback, inspect.isfunction)
    if name.startswith("on_")
)


class TuneCallback(Callback):
    """Calls ``_handle(trainer)`` at each hook ``on`` names (one or a list, without the
    ``on_``; Ray's default ``validation_end``)."""

    def __init__(self, on: str | list[str] = "validation_end") -> None:
        super().__init__()
        hooks = [on] if isinstance(on, str) else list(on)
        unknown = [hook for hook in hooks if hook not in HOOKS]
        if unknown or not hooks:
            raise ValueError(
                f"`on` is {on!r}, but must name Lightning Callback hooks without their `on_`, "
                f"for example 'validation_end' or 'train_epoch_end'; this Lightning has "
                f"{sorted(HOOKS)}"
            )
        self._on = frozenset(hooks)

    def _handle(self, trainer: Trainer) -> None:
        raise NotImplementedError

    def _hook(self, name: str, trainer: Trainer) -> None:
        # the validation that Lightning runs before training (two batches) is no result
        if name in self._on and not trainer.sanity_checking:
            self._handle(trainer)


def _hook_method(name: str) -> Callable[..., None]:
    def hook(self: TuneCallback, trainer: Trainer, *args: Any, **kwargs: Any) -> None:
        self._hook(name, trainer)

    hook.__name__ = f"on_{name}"
    return hook


for _name in HOOKS:
    setattr(TuneCallback, f"on_{_name}", _hook_method(_name))


class TuneReportCheckpointCallback(TuneCallback):
    """Reports the trainer's ``callback_metrics`` at each hook in ``on``: all of them if
    ``metrics`` is None, else those named (a dict renames ``{reported: Lightning's}``; a
    name Lightning has not logged is left out with a warning, as Ray does, and a hook with
    nothing to report reports nothing). With ``save_checkpoints`` (the default) each report
    carries ``trainer.save_checkpoint`` as ``filename`` in the checkpoint's folder."""

    def __init__(
        self,
        metrics: str | list[str] | dict[str, str] | None = None,
        filename: str = "checkpoint",
        save_checkpoints: bool = True,
        on: str | list[str] = "validation_end",
    ) -> None:
        super().__init__(on=on)
        if isinstance(metrics, str):
            metrics = [metrics]
        if metrics is not None and not isinstance(metrics, list | dict):
            raise TypeError(f"`metrics` is {metrics!r}, but must be a name, a list or a dict")
        if not isinstance(filename, str) or not filename or Path(filename).name != filename:
            raise ValueError(f"`filename` is {filename!r}, but must be a file name (no folder)")
        self._metrics = metrics
        self._filename = filename
        self._save_checkpoints = save_checkpoints

    def metrics_of(self, trainer: Trainer) -> dict[str, Any]:
        """The metrics a report holds, as Python numbers."""
        logged = trainer.callback_metrics
        if not self._metrics:
            return {name: _number(value) for name, value in logged.items()}
        pairs = self._metrics.items() if isinstance(self._metrics, dict) else (
            (name, name) for name in self._metrics
        )  # fmt: skip
        out = {}
        for name, source in pairs:
            if source in logged:
                out[name] = _number(logged[source])
            else:
                logger.warning(
                    "metric %r is not in the trainer's callback_metrics (%s): not reported",
                    source,
                    sorted(logged),
                )
        return out

    def _handle(self, trainer: Trainer) -> None:
        metrics = self.metrics_of(trainer)
        if not metrics:
            return
        if not self._save_checkpoints:
            report(metrics)
            return
        with tempfile.TemporaryDirectory() as folder:
            trainer.save_checkpoint(str(Path(folder, self._filename)))
            report(metrics, checkpoint=Checkpoint.from_directory(folder))


class TuneReportCallback(TuneReportCheckpointCallback):
    """Deprecated in Ray: ``TuneReportCheckpointCallback(save_checkpoints=False)``."""

    def __init__(
        self,
        metrics: str | list[str] | dict[str, str] | None = None,
        on: str | list[str] = "validation_end",
    ) -> None:
        warnings.warn(
            "TuneReportCallback is deprecated (as in Ray): use "
            "TuneReportCheckpointCallback(metrics, save_checkpoints=False)",
            DeprecationWarning,
            stacklevel=2,
        )
        super().__init__(metrics=metrics, save_checkpoints=False, on=on)


def _number(value: Any) -> Any:
    # Lightning logs 0-d tensors; .item() gives the Python number a result holds
    return value.item() if hasattr(value, "item") else value
