"""``ray.tune.integration.keras``: report Keras's logs (and the model as a checkpoint) to
popflow, on any Keras 3 backend."""

from popflow.tasks.keras_report import TuneReportCallback, TuneReportCheckpointCallback

__all__ = ["TuneReportCallback", "TuneReportCheckpointCallback"]
