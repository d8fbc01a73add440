"""``ray.tune.schedulers.hb_bohb``: ``from popflow.tune.schedulers.hb_bohb import
HyperBandForBOHB`` (use it with ``popflow.tune.search.bohb.TuneBOHB``)."""

from popflow.schedulers.hb_bohb import HyperBandForBOHB

__all__ = ["HyperBandForBOHB"]
