"""``ray.tune.schedulers.pb2``: ``from popflow.tune.schedulers.pb2 import PB2``."""

from popflow.schedulers.pb2 import PB2

__all__ = ["PB2"]
