"""``ray.tune.search``: what suggests each new trial's config.

    from popflow.tune.search import ConcurrencyLimiter
    from popflow.tune.search.optuna import OptunaSearch
    tune_config = tune.TuneConfig(search_alg=ConcurrencyLimiter(OptunaSearch(), 4), ...)

The searcher's calls are committed with the rounds, so a resumed run continues its
model (:mod:`popflow.flows.driver.suggestions`).
"""

from popflow.schedulers.search import (
    BasicVariantGenerator,
    ConcurrencyLimiter,
    Repeater,
    Searcher,
)

#: Ray's name for what ``TuneConfig(search_alg=...)`` takes (a ``Searcher`` here)
SearchAlgorithm = Searcher

__all__ = [
    "BasicVariantGenerator",
    "ConcurrencyLimiter",
    "Repeater",
    "SearchAlgorithm",
    "Searcher",
]
