"""``ray.tune.search.optuna``: Optuna's samplers (TPE by default) as a search algorithm.
Needs the ``optuna`` extra (``pip install 'popflow[optuna]'``)."""

from popflow.flows.integrations.optuna_search import OptunaSearch

__all__ = ["OptunaSearch"]
