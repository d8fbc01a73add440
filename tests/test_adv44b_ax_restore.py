"""Adversary (issue 44, item 11): ``Tuner.restore`` of an experiment searched by
``AxSearch`` with the metric and mode given to ``TuneConfig`` (Ray's ax_example.py does).

The restored run checks the searcher again with no mode (the experiment's metric and mode
are not handed back to it) and refuses: "AxSearch has no `mode`: pass 'min' or 'max' to
it or to `tune.TuneConfig()`". Two Sobol trials only (no BoTorch step).
"""

from __future__ import annotations

import pytest

from popflow import tune
from popflow.tune.search.ax import AxSearch

pytestmark = pytest.mark.integration


def _objective(config):
    tune.report({"m": -((config["x"] - 0.3) ** 2)})


def test_an_ax_experiment_is_restored(initialised, tmp_path):
    storage = str(tmp_path / "results")
    first = tune.Tuner(
        _objective,
        param_space={"x": tune.uniform(0, 1)},
        tune_config=tune.TuneConfig(
            search_alg=AxSearch(),
            metric="m",
            mode="max",
            num_samples=2,
            seed=3,
        ),
        run_config=tune.RunConfig(name="ax", storage_path=storage, verbose=0),
    ).fit()
    assert first.errors == []
    restored = tune.Tuner.restore(first.experiment_path, _objective).fit()
    assert restored.errors == []
    assert sorted(r.config["x"] for r in restored) == sorted(r.config["x"] for r in first)
