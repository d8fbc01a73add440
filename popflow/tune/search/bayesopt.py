"""``ray.tune.search.bayesopt``: Bayesian optimisation with a Gaussian process
(``bayes_opt``) as a search algorithm. Needs the ``bayesopt`` extra
(``pip install 'popflow[bayesopt]'``)."""

from popflow.flows.integrations.bayesopt_search import BayesOptSearch

__all__ = ["BayesOptSearch"]
