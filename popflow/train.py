"""Ray's ``ray.train`` names that Tune scripts use: ``from popflow import train`` where a
script had ``from ray import train``.

Before Ray 2.41 a function trainable reported with ``train.report`` and read its checkpoint
with ``train.get_checkpoint``; scripts and Ray's older guide still do. popflow takes both
spellings: ``train.report`` is ``tune.report``, ``train.RunConfig`` is ``tune.RunConfig``,
and so on. (Ray 2.60 itself raises a ``DeprecationWarning`` for ``train.report`` inside a
Tune trainable: see docs/how-to/from-ray-tune.md.)
"""

from popflow.flows.experiment.results import Result
from popflow.flows.spec.config import CheckpointConfig
from popflow.flows.spec.ray_configs import FailureConfig, RunConfig
from popflow.flows.spec.scaling import ScalingConfig
from popflow.tasks import Checkpoint, get_checkpoint, report
from popflow.tasks.trial_context import get_context

__all__ = [
    "Checkpoint",
    "CheckpointConfig",
    "FailureConfig",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "get_checkpoint",
    "get_context",
    "report",
]
