"""``ray.tune.integration.pytorch_lightning``: report PyTorch Lightning's logged metrics
(and the trainer's checkpoints) to popflow."""

from popflow.tasks.lightning_report import (
    TuneCallback,
    TuneReportCallback,
    TuneReportCheckpointCallback,
)

__all__ = ["TuneCallback", "TuneReportCallback", "TuneReportCheckpointCallback"]
