"""``ray.tune.search``: what suggests each new trial's config.

    from popflow.tune.search import ConcurrencyLimiter
    from popflow.tune.search.optuna import OptunaSearch
    tune_config = tune.TuneConfig(search_alg=ConcurrencyLimiter(OptunaSearch(), 4), ...)

The searcher's calls are committed with the rounds, so a resumed run continues its
model (:mod:`popflow.flows.driver.suggestions`).
"""

import importlib
import inspect
from typing import Any

from popflow.schedulers.search import (
    BasicVariantGenerator,
    ConcurrencyLimiter,
    Repeater,
    Searcher,
)

#: Ray's name for what ``TuneConfig(search_alg=...)`` takes (a ``Searcher`` here)
SearchAlgorithm = Searcher

#: Ray's names for :func:`create_searcher`: each searcher's module, imported when asked for
SEARCH_ALG_IMPORT = {
    "variant_generator": "popflow.tune.search.basic_variant:BasicVariantGenerator",
    "random": "popflow.tune.search.basic_variant:BasicVariantGenerator",
    "ax": "popflow.tune.search.ax:AxSearch",
    "hyperopt": "popflow.tune.search.hyperopt:HyperOptSearch",
    "bayesopt": "popflow.tune.search.bayesopt:BayesOptSearch",
    "bohb": "popflow.tune.search.bohb:TuneBOHB",
    "nevergrad": "popflow.tune.search.nevergrad:NevergradSearch",
    "optuna": "popflow.tune.search.optuna:OptunaSearch",
    "hebo": "popflow.tune.search.hebo:HEBOSearch",
}


def create_searcher(search_alg: str, **kwargs: Any) -> Searcher:
    """Ray's ``tune.create_searcher``: the searcher named ``search_alg`` (a key of
    :data:`SEARCH_ALG_IMPORT`), made with those ``kwargs`` its constructor takes."""
    name = search_alg.lower()
    if name not in SEARCH_ALG_IMPORT:
        raise ValueError(
            f"The `search_alg` argument must be one of {list(SEARCH_ALG_IMPORT)}. Got: {search_alg}"
        )
    module, cls_name = SEARCH_ALG_IMPORT[name].split(":")
    cls = getattr(importlib.import_module(module), cls_name)
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    takes = {n for n, p in inspect.signature(cls).parameters.items() if p.kind in named}
    return cls(**{k: v for k, v in kwargs.items() if k in takes})


__all__ = [
    "SEARCH_ALG_IMPORT",
    "BasicVariantGenerator",
    "ConcurrencyLimiter",
    "Repeater",
    "SearchAlgorithm",
    "Searcher",
    "create_searcher",
]
