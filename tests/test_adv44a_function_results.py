"""Adversary (issue 44, item 1): what a finished function trainable's last result says.

Ray 2.60 marks the last result of a trial that finished ``done=True``
(``Result.metrics["done"]``), whether the function reported, yielded or returned it (run
side by side on Ray: ``True`` in each case). popflow leaves ``done=False`` there, so a Ray
script that picks the finished trials by ``result.metrics["done"]`` finds none.
"""

from __future__ import annotations

import pytest

from popflow import tune

pytestmark = pytest.mark.integration


def _reports(config):
    for i in range(3):
        tune.report({"score": i})


def _returns(config):
    tune.report({"score": 0})
    return {"score": 100}


def _yields(config):
    for i in range(3):
        yield {"score": i}


@pytest.mark.parametrize("trainable", [_reports, _returns, _yields])
def test_a_finished_trials_last_result_is_done(initialised, tmp_path, trainable):
    results = tune.Tuner(
        trainable,
        run_config=tune.RunConfig(name="done", storage_path=str(tmp_path / "r"), verbose=0),
    ).fit()
    assert results[0].error is None
    assert results[0].metrics["done"] is True
