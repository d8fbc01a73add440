"""Ray's ``ray.tune.integration.xgboost.TuneReportCheckpointCallback``: an XGBoost
callback that reports each boosting round's evaluation metrics to popflow, with the
booster as a checkpoint every ``frequency`` rounds and at the end.

    def train(config):
        xgb.train(config, dtrain, evals=[(dtest, "test")],
                  callbacks=[TuneReportCheckpointCallback(frequency=1)])

Metrics are named ``<eval name>-<metric>`` (``test-logloss``). Needs ``xgboost``
(``pip install 'popflow[xgboost]'``).
"""

from __future__ import annotations

from typing import Any

from xgboost import Booster
from xgboost.callback import TrainingCallback

from popflow.tasks.boosting_reports import (
    Metrics,
    Postprocess,
    check_arguments,
    dash_joined,
    model_path,
    pick,
    report_with_model,
)
from popflow.tasks.checkpoint import Checkpoint
from popflow.tasks.function_api import report


class TuneReportCheckpointCallback(TrainingCallback):
    """Reports ``metrics`` (all of the evaluation log if None; a dict renames
    ``{reported: xgboost's}``) after every round; every ``frequency`` rounds (0: never)
    with the booster saved as ``filename`` in a checkpoint, and at the end of training
    if ``checkpoint_at_end`` and the last round has none. ``results_postprocessing_fn``
    changes the dict before it is reported (``xgboost.cv``: average the folds)."""

    CHECKPOINT_NAME = "model.ubj"

    def __init__(
        self,
        metrics: Metrics = None,
        filename: str = CHECKPOINT_NAME,
        frequency: int = 0,
        checkpoint_at_end: bool = True,
        results_postprocessing_fn: Postprocess = None,
    ) -> None:
        super().__init__()
        self._metrics = check_arguments(metrics, frequency)
        self._filename = filename
        self._frequency = frequency
        self._checkpoint_at_end = checkpoint_at_end
        self._postprocess = results_postprocessing_fn
        self._last: dict[str, Any] | None = None
        self._checkpointed_round: int | None = None

    @classmethod
    def get_model(cls, checkpoint: Checkpoint, filename: str = CHECKPOINT_NAME) -> Booster:
        """The booster a checkpoint of this callback holds."""

        def load(path: str) -> Booster:
            booster = Booster()
            booster.load_model(path)
            return booster

        return model_path(checkpoint, filename, load)

    def after_iteration(self, model: Any, epoch: int, evals_log: dict[str, Any]) -> bool:
        # the last value of each metric (xgboost.cv's are (mean, std) pairs, as in Ray)
        flat = {k: v[-1] for k, v in dash_joined(evals_log).items()}
        self._last = metrics = pick(flat, self._metrics, self._postprocess)
        if self._frequency and (epoch + 1) % self._frequency == 0:
            self._checkpointed_round = epoch
            report_with_model(metrics, self._filename, _saver(model))
        else:
            report(metrics)
        return False  # go on training

    def after_training(self, model: Any) -> Any:
        if not self._checkpoint_at_end:
            return model
        if self._checkpointed_round is not None and (
            _rounds(model) - 1 == self._checkpointed_round
        ):
            return model  # the last round's checkpoint is there already
        report_with_model(self._last or {}, self._filename, _saver(model))
        return model


def _saver(model: Any) -> Any:
    # xgboost.cv hands a packed list of boosters: Ray saves nothing usable either; the
    # first fold's booster is the model kept
    booster = model if isinstance(model, Booster) else model.cvfolds[0].bst
    return booster.save_model


def _rounds(model: Any) -> int:
    booster = model if isinstance(model, Booster) else model.cvfolds[0].bst
    return booster.num_boosted_rounds()
