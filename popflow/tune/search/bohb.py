"""``ray.tune.search.bohb``: BOHB's model (TPE-like good/bad KDEs over HyperBand's budgets)
as a search algorithm, written in numpy/scipy: no hpbandster or ConfigSpace needed. Use it
with ``popflow.tune.schedulers.hb_bohb.HyperBandForBOHB``."""

from popflow.schedulers.search.bohb import TuneBOHB

__all__ = ["TuneBOHB"]
