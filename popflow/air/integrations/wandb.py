"""Ray's ``ray.air.integrations.wandb``: :class:`WandbLoggerCallback` (on the driver)
and :func:`setup_wandb` (in the trainable).

Needs the ``wandb`` extra (``pip install 'popflow[wandb]'``), asked for when used.
"""

from popflow.flows.integrations.wandb import WandbLoggerCallback
from popflow.tasks.wandb_setup import setup_wandb

__all__ = ["WandbLoggerCallback", "setup_wandb"]
