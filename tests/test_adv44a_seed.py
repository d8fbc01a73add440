"""Adversary (issue 44, item 3): ``random.seed`` before ``Tuner`` with a ``sample_from``
that calls Python's ``random``.

In Ray 2.60 the searcher resolves ``sample_from`` in the script's process with the
script's ``random`` stream, so ``random.seed(1234)`` before ``Tuner`` gives the same
``sample_from`` values run after run (checked on Ray 2.60: two runs of a script with
``random.seed(1234)`` and ``tune.sample_from(lambda spec: random.random())`` gave the same
four values; the numpy-sampled ``tune.uniform`` differed, as expected without
``np.random.seed``). popflow reseeds ``random`` from a seed drawn from numpy's global
state, so without ``np.random.seed`` the script's ``random.seed`` is lost.
"""

from __future__ import annotations

import random

import pytest

from popflow import tune

pytestmark = pytest.mark.integration


def _trainable(config):
    tune.report({"s": 1})


def _sample_from_values(storage: str, name: str) -> list[float]:
    space = {
        "g": tune.grid_search([1, 2]),
        "c": tune.sample_from(lambda spec: random.random()),
    }
    results = tune.Tuner(
        _trainable,
        param_space=space,
        tune_config=tune.TuneConfig(num_samples=2),
        run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0),
    ).fit()
    return sorted(r.config["c"] for r in results)


def test_random_seed_repeats_sample_from_using_random(initialised, tmp_path):
    storage = str(tmp_path / "results")
    random.seed(1234)
    first = _sample_from_values(storage, "one")
    random.seed(1234)
    second = _sample_from_values(storage, "two")
    assert first == second
