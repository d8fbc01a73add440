"""What runs on a Dask worker: the Trainable class API, the function API, segments."""

from popflow.tasks.checkpoint import Checkpoint
from popflow.tasks.function_api import get_checkpoint, report
from popflow.tasks.trainable import Trainable

__all__ = ["Checkpoint", "Trainable", "get_checkpoint", "report"]
