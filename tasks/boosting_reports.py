"""What Ray's XGBoost and LightGBM report callbacks share: the metrics a boosting round
reports, picked and renamed from the library's evaluation log, and a checkpoint of the
model written to a temporary folder and reported with them.

The callbacks themselves (:mod:`popflow.tasks.xgboost_report`,
:mod:`popflow.tasks.lightgbm_report`) run inside the user's function trainable, on its
worker, as Ray's do; ``report`` ends the segment there when the scheduler says so.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from popflow.tasks.checkpoint import Checkpoint
from popflow.tasks.function_api import report

Metrics = str | list[str] | dict[str, str] | None
Postprocess = Callable[[dict[str, Any]], dict[str, Any]] | None


class BoostingReport:
    """Ray's arguments of both callbacks, checked: ``metrics`` (all of the evaluation log
    if None; a dict renames ``{reported: library's}``), a checkpoint holding the booster
    as ``filename`` (None: the class's ``CHECKPOINT_NAME``) every ``frequency`` rounds (0:
    never) and at the end if ``checkpoint_at_end``, ``results_postprocessing_fn`` applied
    to the dict before it is reported."""

    CHECKPOINT_NAME = "model"

    def __init__(
        self,
        metrics: Metrics = None,
        filename: str | None = None,
        frequency: int = 0,
        checkpoint_at_end: bool = True,
        results_postprocessing_fn: Postprocess = None,
    ) -> None:
        super().__init__()  # the library's callback base, where there is one
        self._metrics = check_arguments(metrics, frequency)
        self._filename = filename or self.CHECKPOINT_NAME
        self._frequency = frequency
        self._checkpoint_at_end = checkpoint_at_end
        self._postprocess = results_postprocessing_fn

    def metrics_of(self, flat: dict[str, Any]) -> dict[str, Any]:
        """What a round reports, from the evaluation log's ``dash_joined`` values."""
        return pick(flat, self._metrics, self._postprocess)

    def due(self, round_index: int) -> bool:
        """Round ``round_index`` (from 0) is one of every ``frequency``."""
        return bool(self._frequency) and (round_index + 1) % self._frequency == 0

    def report(self, metrics: dict[str, Any], save: Callable[[str], Any] | None) -> None:
        """Report ``metrics``, with a checkpoint of the booster ``save`` writes if given."""
        if save is None:
            report(metrics)
        else:
            report_with_model(metrics, self._filename, save)


def check_arguments(metrics: Metrics, frequency: int) -> list[str] | dict[str, str] | None:
    """``metrics`` as a list or a dict (Ray takes one name as a list of one)."""
    if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 0:
        raise ValueError(f"`frequency` is {frequency!r}, but must be an int >= 0 (0: never)")
    if isinstance(metrics, str):
        return [metrics]
    if metrics is not None and not isinstance(metrics, list | dict):
        raise TypeError(f"`metrics` is {metrics!r}, but must be a name, a list or a dict")
    return metrics


def dash_joined(log: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"eval": {"logloss": x}}`` as ``{"eval-logloss": x}`` (Ray's names)."""
    out: dict[str, Any] = {}
    for key, value in log.items():
        if isinstance(value, Mapping):
            out.update(dash_joined(value, f"{prefix}{key}-"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def pick(
    flat: dict[str, Any], metrics: list[str] | dict[str, str] | None, postprocess: Postprocess
) -> dict[str, Any]:
    """The reported metrics: all of ``flat``, or those ``metrics`` names (a dict renames
    ``{reported: library's}``), then ``postprocess``-ed."""
    if metrics:
        pairs = list(metrics.items() if isinstance(metrics, dict) else ((m, m) for m in metrics))
        missing = [source for _, source in pairs if source not in flat]
        if missing:
            raise KeyError(
                f"the callback's `metrics` name {missing}, which the evaluation log does not "
                f"hold; it holds {sorted(flat)}"
            )
        flat = {name: flat[source] for name, source in pairs}
    return postprocess(flat) if postprocess else flat


def report_with_model(metrics: dict[str, Any], filename: str, save: Callable[[str], Any]) -> None:
    """Report ``metrics`` with a checkpoint holding the model, saved by ``save(path)``."""
    with tempfile.TemporaryDirectory() as folder:
        save(str(Path(folder, filename)))
        report(metrics, checkpoint=Checkpoint.from_directory(folder))


def model_path(checkpoint: Checkpoint, filename: str, load: Callable[[str], Any]) -> Any:
    """The model ``load(path)`` reads from ``filename`` in ``checkpoint``."""
    with checkpoint.as_directory() as folder:
        return load(str(Path(folder, filename)))
