"""Ray's ``ray.tune.logger``: :class:`LoggerCallback`, the base of custom loggers, and
:class:`TBXLoggerCallback`, results to TensorBoard (the ``tensorboard`` extra:
``pip install 'popflow[tensorboard]'``, asked for when the callback is made).

A custom logger writes beside each trial in ``trial.local_path`` (Ray 2.60's name; its
files reach the trial's folder, ``trial.path``, on local disk or an object store).

popflow writes each trial's ``result.json`` and ``progress.csv`` itself, so
Ray's ``CSVLoggerCallback``/``JsonLoggerCallback`` have no counterpart here.
"""

from popflow.flows.events.callbacks import LoggerCallback
from popflow.flows.integrations.tensorboard import TBXLoggerCallback

__all__ = ["LoggerCallback", "TBXLoggerCallback"]
