"""Ray's ``ray.tune.logger``: :class:`LoggerCallback`, the base of custom loggers.

popflow writes each trial's ``result.json`` and ``progress.csv`` itself, so
Ray's ``CSVLoggerCallback``/``JsonLoggerCallback`` have no counterpart here.
"""

from popflow.flows.callbacks import LoggerCallback

__all__ = ["LoggerCallback"]
