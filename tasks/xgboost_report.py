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
    BoostingReport,
    dash_joined,
    model_path,
)
from popflow.tasks.checkpoint import Checkpoint


class TuneReportCheckpointCallback(BoostingReport, TrainingCallback):
    """Reports after every round (see :class:`BoostingReport` for the arguments); the
    checkpoint at the end comes after training, unless the last round has one
    (``xgboost.cv``: ``results_postprocessing_fn`` may average the folds)."""

    CHECKPOINT_NAME = "model.ubj"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
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
        self._last = metrics = self.metrics_of(
            {k: v[-1] for k, v in dash_joined(evals_log).items()}
        )
        keep = self.due(epoch)
        if keep:
            self._checkpointed_round = epoch
        self.report(metrics, _booster(model).save_model if keep else None)
        return False  # go on training

    def after_training(self, model: Any) -> Any:
        booster = _booster(model)
        if not self._checkpoint_at_end:
            return model
        if self._checkpointed_round == booster.num_boosted_rounds() - 1:
            return model  # the last round's checkpoint is there already
        self.report(self._last or {}, booster.save_model)
        return model


def _booster(model: Any) -> Booster:
    # xgboost.cv hands a packed list of boosters: Ray saves nothing usable either; the
    # first fold's booster is the model kept
    return model if isinstance(model, Booster) else model.cvfolds[0].bst
