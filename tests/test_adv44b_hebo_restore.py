"""Adversary (issue 44, item 11): ``Tuner.restore`` of an experiment searched by
``HEBOSearch`` with the metric and mode given to ``TuneConfig`` (as Ray's HEBO example
does).

The restored run checks the searcher again with no metric and mode (the experiment's are
not handed back to it), and HEBOSearch's eager set-up refuses: "HEBOSearch has
metric=None and mode=None: pass both to it, or to the run". It fails the same way after a
``kill -9`` of the driver mid-run, which is what ``Tuner.restore`` is for.
"""

from __future__ import annotations

import pytest

from popflow import tune
from popflow.tune.search.hebo import HEBOSearch

pytestmark = pytest.mark.integration


def _objective(config):
    tune.report({"m": -((config["x"] - 0.3) ** 2)})


def test_a_hebo_experiment_is_restored(initialised, tmp_path):
    storage = str(tmp_path / "results")
    first = tune.Tuner(
        _objective,
        param_space={"x": tune.uniform(0, 1)},
        tune_config=tune.TuneConfig(
            search_alg=HEBOSearch(random_state_seed=7, max_concurrent=1),
            metric="m",
            mode="max",
            num_samples=3,
            seed=3,
        ),
        run_config=tune.RunConfig(name="hebo", storage_path=storage, verbose=0),
    ).fit()
    assert first.errors == []
    restored = tune.Tuner.restore(first.experiment_path, _objective).fit()
    assert restored.errors == []
    assert sorted(r.config["x"] for r in restored) == sorted(r.config["x"] for r in first)
