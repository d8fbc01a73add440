"""Ray's ``ray.tune.integration.lightgbm.TuneReportCheckpointCallback``: a LightGBM
callback that reports each boosting round's evaluation metrics to popflow, with the
booster as a checkpoint every ``frequency`` rounds and at the last round.

    def train(config):
        lgb.train(config, train_set, valid_sets=[test_set], valid_names=["eval"],
                  callbacks=[TuneReportCheckpointCallback({"loss": "eval-binary_logloss"})])

Metrics are named ``<valid name>-<metric>`` (``lgb.cv``: ``valid-<metric>-mean`` and
``-stdv``). Needs ``lightgbm`` (``pip install 'popflow[lightgbm]'``).
"""

from __future__ import annotations

from typing import Any

from lightgbm import Booster

from popflow.tasks.boosting_reports import (
    BoostingReport,
    dash_joined,
    model_path,
)
from popflow.tasks.checkpoint import Checkpoint


class TuneReportCheckpointCallback(BoostingReport):
    """Reports after every round (see :class:`BoostingReport` for the arguments); the
    checkpoint at the end is the last round's."""

    CHECKPOINT_NAME = "model.txt"
    # lightgbm calls callbacks by ``order``; after its own (early stopping is 30)
    order = 40

    @classmethod
    def get_model(cls, checkpoint: Checkpoint, filename: str = CHECKPOINT_NAME) -> Booster:
        """The booster a checkpoint of this callback holds."""
        return model_path(checkpoint, filename, lambda path: Booster(model_file=path))

    def __call__(self, env: Any) -> None:
        metrics = self.metrics_of(dash_joined(_results(env)))
        last = env.iteration == env.end_iteration - 1
        keep = (last and self._checkpoint_at_end) or self.due(env.iteration)
        self.report(metrics, _booster(env.model).save_model if keep else None)


def _results(env: Any) -> dict[str, dict[str, Any]]:
    """``{data name: {metric: value}}``; ``lgb.cv``'s entries carry a mean and a stdv."""
    out: dict[str, dict[str, Any]] = {}
    for entry in env.evaluation_result_list:
        data, name, value = entry[:3]
        if len(entry) > 4:  # lgb.cv: (data, name, mean, higher_better, stdv)
            out.setdefault(data, {})[f"{name}-mean"] = value
            out[data][f"{name}-stdv"] = entry[4]
        else:
            out.setdefault(data, {})[name] = value
    return out


def _booster(model: Any) -> Booster:
    # lgb.cv hands a CVBooster: its first fold's booster is the model kept
    return model if isinstance(model, Booster) else model.boosters[0]
