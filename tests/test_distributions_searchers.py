"""The search algorithms that translate popflow's (Ray's) domains take ``qrandn`` and
``qlograndint`` or refuse them naming the parameter, and translate the quantized integers
to the values popflow samples (Ray 2.60's rule: ``upper`` excluded with ``q=1``)."""

from __future__ import annotations

import numpy as np
import pytest

from popflow.flows.integrations import (
    bayesopt_search,
    hyperopt_search,
    nevergrad_search,
    optuna_search,
)
from popflow.schedulers.search.bohb_model import _Param
from popflow.schedulers.search.bohb_model import convert_search_space as bohb_space
from popflow.schedulers.search_space import qlograndint, qrandint, qrandn

pytestmark = pytest.mark.unit


def test_optuna_translates_what_it_can_and_refuses_the_rest_by_name() -> None:
    import optuna

    dist = optuna_search.convert_search_space(
        {"a": qrandint(0, 3), "b": qrandint(3, 12, 5), "c": qlograndint(1, 10, 1)}
    )
    assert dist["a"] == optuna.distributions.IntDistribution(0, 2)
    assert dist["b"] == optuna.distributions.IntDistribution(5, 10, step=5)
    assert dist["c"] == optuna.distributions.IntDistribution(1, 9, log=True)
    with pytest.raises(ValueError, match=r"`d` \(qlograndint with q=2\)"):
        optuna_search.convert_search_space({"d": qlograndint(1, 10, 2)})
    with pytest.raises(ValueError, match=r"`e` \(QNormal\)"):
        optuna_search.convert_search_space({"e": qrandn(0, 1, 0.5)})


def test_hyperopt_samples_qrandn_and_qlograndint_on_their_grids() -> None:
    import hyperopt.pyll.stochastic

    space = hyperopt_search.convert_search_space(
        {"n": qrandn(10, 2, 0.5), "k": qlograndint(1, 10, 2), "i": qrandint(0, 3)}
    )
    rng = np.random.default_rng(0)
    samples = [hyperopt.pyll.stochastic.sample(space, rng=rng) for _ in range(300)]
    assert all(s["n"] == round(s["n"] / 0.5) * 0.5 for s in samples)
    assert {s["k"] for s in samples} <= {2, 4, 6, 8, 10}
    assert {s["i"] for s in samples} == {0, 1, 2}


def test_nevergrad_drops_q_with_a_warning_as_ray_and_keeps_the_bounds(caplog) -> None:
    params = nevergrad_search.convert_search_space(
        {"k": qlograndint(1, 10, 2), "n": qrandn(0, 1, 0.5)}
    )
    params.random_state.seed(0)
    values = {params.sample().value["k"] for _ in range(200)}
    assert values <= set(range(2, 11)) and len(values) > 3
    assert "Nevergrad cannot quantize `k`" in caplog.text
    assert "Nevergrad cannot quantize `n`" in caplog.text


def test_bayesopt_refuses_them_naming_the_parameter() -> None:
    for domain, name in ((qrandn(0, 1, 0.5), "QNormal"), (qlograndint(1, 10, 2), "QLogRandInt")):
        with pytest.raises(ValueError, match=f"type `{name}` \\(`x`\\)"):
            bayesopt_search.convert_search_space({"x": domain})


def test_bohb_models_them_on_their_grids() -> None:
    space = bohb_space({"n": qrandn(0, 1, 0.5), "k": qlograndint(1, 10, 2), "i": qrandint(0, 3)})
    assert set(space) == {"n", "k", "i"}
    grid = np.linspace(0, 1, 201)
    for name, support in (("k", {2, 4, 6, 8, 10}), ("i", {0, 1, 2})):
        param = _Param(name, space[name])
        values = {param.value(x) for x in grid}
        assert values == support
        assert all(param.value(param.coordinate(v)) == v for v in values)
    normal = _Param("n", space["n"])
    assert all(normal.value(x) == round(normal.value(x) / 0.5) * 0.5 for x in grid)
