"""``ray.tune.integration.xgboost``: report XGBoost's rounds (and checkpoints) to popflow."""

from popflow.tasks.xgboost_report import TuneReportCheckpointCallback

__all__ = ["TuneReportCheckpointCallback"]
