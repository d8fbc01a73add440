"""``ray.tune.search.hyperopt``: HyperOpt's TPE as a search algorithm, conditional spaces
included. Needs the ``hyperopt`` extra (``pip install 'popflow[hyperopt]'``)."""

from popflow.flows.integrations.hyperopt_search import HyperOptSearch

__all__ = ["HyperOptSearch"]
