"""``ray.tune.search.nevergrad``: a Nevergrad optimizer (``ask``/``tell``) as a search
algorithm. Needs the ``nevergrad`` extra (``pip install 'popflow[nevergrad]'``)."""

from popflow.flows.integrations.nevergrad_search import NevergradSearch

__all__ = ["NevergradSearch"]
