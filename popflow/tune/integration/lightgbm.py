"""``ray.tune.integration.lightgbm``: report LightGBM's rounds (and checkpoints) to popflow."""

from popflow.tasks.lightgbm_report import TuneReportCheckpointCallback

__all__ = ["TuneReportCheckpointCallback"]
