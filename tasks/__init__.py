"""What runs on a Dask worker: the Trainable class API, the function API, segments."""

from tasks.checkpoint import Checkpoint
from tasks.function_api import get_checkpoint, report
from tasks.trainable import Trainable

__all__ = ["Checkpoint", "Trainable", "get_checkpoint", "report"]
