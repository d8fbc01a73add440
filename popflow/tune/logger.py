"""Ray's ``ray.tune.logger``: :class:`LoggerCallback`, the base of custom loggers, and
:class:`TBXLoggerCallback`, results to TensorBoard (the ``tensorboard`` extra:
``pip install 'popflow[tensorboard]'``, asked for when the callback is made).

popflow writes each trial's ``result.json`` and ``progress.csv`` itself, so
Ray's ``CSVLoggerCallback``/``JsonLoggerCallback`` have no counterpart here.
"""

from popflow.flows.events.callbacks import LoggerCallback
from popflow.flows.integrations.tensorboard import TBXLoggerCallback

__all__ = ["LoggerCallback", "TBXLoggerCallback"]
