"""Ray's XGBoost and LightGBM report callbacks (``popflow.tune.integration``) inside
function trainables, through the real driver on the simulated backend."""

from __future__ import annotations

from typing import Any

import lightgbm as lgb
import numpy as np
import pytest
import xgboost as xgb
from sklearn.datasets import load_breast_cancer

import popflow
from popflow import ASHAScheduler
from popflow.tune.integration.lightgbm import TuneReportCheckpointCallback as LgbCallback
from popflow.tune.integration.xgboost import TuneReportCheckpointCallback as XgbCallback

pytestmark = pytest.mark.unit

ROUNDS = 5


def data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    x, y = load_breast_cancer(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order], y[order]
    return x[:400], y[:400], x[400:], y[400:]


def xgb_train(config: dict[str, Any]) -> None:
    x, y, xv, yv = data()
    params = {"objective": "binary:logistic", "eval_metric": ["logloss", "error"]}
    xgb.train(
        {**params, "eta": config["eta"], "nthread": 1},
        xgb.DMatrix(x, label=y),
        num_boost_round=ROUNDS,
        evals=[(xgb.DMatrix(xv, label=yv), "test")],
        verbose_eval=False,
        callbacks=[XgbCallback({"loss": "test-logloss"}, filename="b.json", frequency=2)],
    )


def xgb_cv(config: dict[str, Any]) -> None:
    x, y, _, _ = data()
    xgb.cv(
        {"objective": "binary:logistic", "eval_metric": "logloss", "nthread": 1},
        xgb.DMatrix(x, label=y),
        num_boost_round=ROUNDS,
        nfold=3,
        callbacks=[
            XgbCallback(
                # xgboost.cv logs (mean, std) pairs: keep the means
                results_postprocessing_fn=lambda d: {k: float(v[0]) for k, v in d.items()}
            )
        ],
    )


def lgb_train(config: dict[str, Any]) -> None:
    x, y, xv, yv = data()
    lgb.train(
        {"objective": "binary", "metric": ["binary_logloss"], "verbose": -1, "num_threads": 1,
         "learning_rate": config["eta"]},
        lgb.Dataset(x, label=y),
        num_boost_round=ROUNDS,
        valid_sets=[lgb.Dataset(xv, label=yv)],
        valid_names=["eval"],
        callbacks=[LgbCallback({"loss": "eval-binary_logloss"}, frequency=2)],
    )  # fmt: skip


def lgb_cv(config: dict[str, Any]) -> None:
    x, y, _, _ = data()
    lgb.cv(
        {"objective": "binary", "metric": "binary_logloss", "verbose": -1, "num_threads": 1},
        lgb.Dataset(x, label=y),
        num_boost_round=ROUNDS,
        nfold=3,
        callbacks=[LgbCallback(frequency=0)],
    )


def simulate(tmp_path, trainable, **kwargs: Any) -> popflow.Simulation:
    return popflow.simulate(
        trainable,
        {"eta": popflow.grid_search([0.3, 0.01])},
        metric=kwargs.pop("metric", "loss"),
        mode="min",
        storage=str(tmp_path),
        **kwargs,
    )


@pytest.mark.parametrize(
    ("train", "callback", "rounds", "reports"),
    [(xgb_train, XgbCallback, lambda b: b.num_boosted_rounds(), ROUNDS + 1),
     (lgb_train, LgbCallback, lambda b: b.current_iteration(), ROUNDS)],
)  # fmt: skip
def test_each_round_is_reported_under_its_name_with_checkpoints_by_frequency(
    tmp_path, train, callback, rounds, reports
):
    """Checkpoints at rounds 2 and 4 (``frequency=2``) and at the end: LightGBM's with its
    last round, XGBoost's after training, as one more report of the last metrics (Ray's
    ``after_training`` reports again too)."""
    sim = simulate(tmp_path, train)
    for result in sim.grid:
        history = list(result.history)
        assert [r["training_iteration"] for r in history] == list(range(1, reports + 1))
        assert all(0 < r["loss"] < 1 for r in history)
        assert history[-1]["loss"] == history[ROUNDS - 1]["loss"]
        kept = sorted(int(c.path.rstrip("/").rsplit("_", 1)[1]) for c, _ in result.best_checkpoints)
        assert kept == [2, 4, reports]
        filename = "b.json" if callback is XgbCallback else callback.CHECKPOINT_NAME
        assert rounds(callback.get_model(result.checkpoint, filename=filename)) == ROUNDS
    best = sim.grid.get_best_result()
    assert best.config["eta"] == 0.3  # the faster learner has the lower loss after 5 rounds


@pytest.mark.parametrize(
    ("train", "metric", "reports"),
    [(xgb_cv, "test-logloss", ROUNDS + 1), (lgb_cv, "valid-binary_logloss-mean", ROUNDS)],
)
def test_cross_validation_reports_its_fold_averages_and_a_model_at_the_end(
    tmp_path, train, metric, reports
):
    sim = simulate(tmp_path, train, metric=metric)
    for result in sim.grid:
        history = list(result.history)
        assert len(history) == reports and all(0 < r[metric] < 1 for r in history)
        assert result.checkpoint is not None  # checkpoint_at_end, from the first fold


def test_a_trial_the_scheduler_stops_unwinds_out_of_training(tmp_path):
    sim = popflow.simulate(
        xgb_train,
        {"eta": popflow.grid_search([0.3, 0.001, 0.0005, 0.0001])},
        scheduler=ASHAScheduler(max_t=ROUNDS, grace_period=1, reduction_factor=4),
        metric="loss",
        mode="min",
        storage=str(tmp_path),
    )
    spent = sorted(len(list(r.history)) for r in sim.grid)
    assert spent[0] < ROUNDS and spent[-1] == ROUNDS and sim.grid.num_errors == 0


def test_bad_callback_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="frequency"):
        XgbCallback(frequency=-1)
    with pytest.raises(TypeError, match="metrics"):
        LgbCallback(metrics=3)

    def wrong_name(config: dict[str, Any]) -> None:
        x, y, xv, yv = data()
        xgb.train({"nthread": 1}, xgb.DMatrix(x, label=y), num_boost_round=2,
                  evals=[(xgb.DMatrix(xv, label=yv), "test")], verbose_eval=False,
                  callbacks=[XgbCallback("eval-logloss")])  # fmt: skip

    sim = popflow.simulate(wrong_name, {}, storage=str(tmp_path))
    (error,) = sim.grid.errors
    assert "eval-logloss" in str(error) and "test-" in str(error)
