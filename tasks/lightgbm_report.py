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


class TuneReportCheckpointCallback:
    """Reports ``metrics`` (all of the evaluation results if None; a dict renames
    ``{reported: lightgbm's}``) after every round; every ``frequency`` rounds (0: never)
    with the booster saved as ``filename`` in a checkpoint, and at the last round if
    ``checkpoint_at_end``. ``results_postprocessing_fn`` changes the dict before it is
    reported."""

    CHECKPOINT_NAME = "model.txt"
    # lightgbm calls callbacks by ``order``; after its own (early stopping is 30)
    order = 40

    def __init__(
        self,
        metrics: Metrics = None,
        filename: str = CHECKPOINT_NAME,
        frequency: int = 0,
        checkpoint_at_end: bool = True,
        results_postprocessing_fn: Postprocess = None,
    ) -> None:
        self._metrics = check_arguments(metrics, frequency)
        self._filename = filename
        self._frequency = frequency
        self._checkpoint_at_end = checkpoint_at_end
        self._postprocess = results_postprocessing_fn

    @classmethod
    def get_model(cls, checkpoint: Checkpoint, filename: str = CHECKPOINT_NAME) -> Booster:
        """The booster a checkpoint of this callback holds."""
        return model_path(checkpoint, filename, lambda path: Booster(model_file=path))

    def __call__(self, env: Any) -> None:
        metrics = pick(dash_joined(_results(env)), self._metrics, self._postprocess)
        last = env.iteration == env.end_iteration - 1
        if (last and self._checkpoint_at_end) or (
            self._frequency and (env.iteration + 1) % self._frequency == 0
        ):
            report_with_model(metrics, self._filename, _saver(env.model))
        else:
            report(metrics)


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


def _saver(model: Any) -> Any:
    # lgb.cv hands a CVBooster: its first fold's booster is the model kept
    booster = model if isinstance(model, Booster) else model.boosters[0]
    return booster.save_model
