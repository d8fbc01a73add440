"""Ray's ``ray.air.integrations.mlflow``: :class:`MLflowLoggerCallback` (on the driver)
and :func:`setup_mlflow` (in the trainable).

Needs the ``mlflow`` extra (``pip install 'popflow[mlflow]'``), asked for when
the callback is made.
"""

from popflow.flows.integrations.mlflow import MLflowLoggerCallback
from popflow.tasks.mlflow_setup import setup_mlflow

__all__ = ["MLflowLoggerCallback", "setup_mlflow"]
