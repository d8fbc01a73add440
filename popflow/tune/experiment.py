"""Ray's ``ray.tune.experiment`` module: the ``Trial`` that callbacks and schedulers see."""

from popflow.schedulers.trial import Trial

__all__ = ["Trial"]
