"""Search algorithms under Ray's names (``ray.tune.search``): the :class:`Searcher`
interface a model-based searcher implements, and the pure ones (no library):
:class:`BasicVariantGenerator` (random and grid search), :class:`ConcurrencyLimiter`,
:class:`Repeater`. Adapters over Optuna and others live in ``popflow.tune.search.*``."""

from popflow.schedulers.search.basic_variant import BasicVariantGenerator
from popflow.schedulers.search.concurrency_limiter import ConcurrencyLimiter
from popflow.schedulers.search.repeater import Repeater
from popflow.schedulers.search.searcher import FINISHED, Searcher, check_searcher

__all__ = [
    "FINISHED",
    "BasicVariantGenerator",
    "ConcurrencyLimiter",
    "Repeater",
    "Searcher",
    "check_searcher",
]
