"""``ray.tune.search.hebo``: Ray's ``HEBOSearch``, under its name and arguments, but
refused when made: no release of HEBO on PyPI installs beside popflow.

HEBO 0.3.5 and 0.3.6 (the newest) pin ``numpy<1.25``, and popflow needs numpy>=1.26 (as
do pandas 3 and SciPy 1.17); HEBO 0.3.2 and older have no numpy pin, but import
``pymoo.factory``, which pymoo 0.6 removed, and the pymoo releases that still have it
(0.5.0 and older, source only) use ``np.object`` and ``np.float``, which numpy 1.24
removed: HEBO's acquisition optimiser fails at its first suggestion. So there is no
``hebo`` extra; use OptunaSearch, AxSearch or BayesOptSearch instead.
"""

from __future__ import annotations

from typing import Any

from popflow.schedulers.search import Searcher

__all__ = ["HEBOSearch"]

#: why HEBOSearch cannot be made (the module's notes, in one line)
UNAVAILABLE = (
    "HEBOSearch needs HEBO, and no HEBO release installs beside popflow: HEBO 0.3.5 and "
    "0.3.6 pin numpy<1.25 (popflow needs numpy>=1.26); HEBO 0.3.2 and older import "
    "pymoo.factory, which pymoo 0.6 removed, and the pymoo releases that have it use numpy "
    "aliases removed in numpy 1.24. Use OptunaSearch, AxSearch ('popflow[ax]') or "
    "BayesOptSearch instead"
)


class HEBOSearch(Searcher):
    """Ray's ``ray.tune.search.hebo.HEBOSearch`` (its arguments: ``space``, ``metric``,
    ``mode``, ``points_to_evaluate``, ``evaluated_rewards``, ``random_state_seed``,
    ``max_concurrent``): refused with the reason (see the module's notes)."""

    def __init__(
        self,
        space: Any = None,
        metric: str | None = None,
        mode: str | None = None,
        points_to_evaluate: list[dict[str, Any]] | None = None,
        evaluated_rewards: list[Any] | None = None,
        random_state_seed: int | None = None,
        max_concurrent: int = 8,
        **kwargs: Any,
    ) -> None:
        raise ImportError(UNAVAILABLE)
