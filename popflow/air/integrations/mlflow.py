"""Ray's ``ray.air.integrations.mlflow``: :class:`MLflowLoggerCallback`.

Needs the ``mlflow`` extra (``pip install 'popflow[mlflow]'``), asked for when
the callback is made.
"""

from popflow.flows.integrations.mlflow import MLflowLoggerCallback

__all__ = ["MLflowLoggerCallback"]
