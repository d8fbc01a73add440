"""Ray's ``ray.tune.tuner`` module: ``from popflow.tune.tuner import Tuner``."""

from popflow.flows.api.tuner import Tuner

__all__ = ["Tuner"]
