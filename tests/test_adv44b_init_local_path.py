"""Adversary (issue 44, item 7): a ``LoggerCallback`` written as Ray 2.60's own loggers
are (``ray/tune/logger/csv.py``, ``json.py``, ``tensorboardx.py``, ``aim.py``): it calls
``trial.init_local_path()`` before opening a file in ``trial.local_path``. popflow's
``Trial`` has no ``init_local_path``, so a logger modelled on Ray's fails at its first
trial (here on S3 storage, where ``local_path`` is the driver's staging folder).
"""

from __future__ import annotations

import os
import tempfile

import pytest
import s3fs

import popflow
from popflow import tune
from popflow.tune.logger import LoggerCallback

pytestmark = pytest.mark.integration


@pytest.fixture
def initialised(prefect_server, dask_cluster, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the staging folders in here
    popflow.init(dask_cluster)
    yield dask_cluster
    popflow.init()


class _RayStyleLogger(LoggerCallback):
    def __init__(self) -> None:
        self._files: dict = {}

    def log_trial_start(self, trial):
        trial.init_local_path()  # as Ray's CSVLoggerCallback
        self._files[trial] = open(os.path.join(trial.local_path, "mine.csv"), "a")  # noqa: SIM115

    def log_trial_result(self, iteration, trial, result):
        if trial not in self._files:
            self.log_trial_start(trial)
        self._files[trial].write(f"{result['training_iteration']}\n")
        self._files[trial].flush()

    def log_trial_end(self, trial, failed=False):
        self._files.pop(trial).close()


def _two(config):
    for i in range(2):
        tune.report({"s": i})


def test_a_logger_modelled_on_rays_own_runs(initialised, s3_server, s3_url):
    _, options = s3_server
    results = tune.Tuner(
        _two,
        param_space={},
        run_config=tune.RunConfig(
            name="raystyle",
            storage_path=s3_url,
            storage_options=options,
            verbose=0,
            callbacks=[_RayStyleLogger()],
        ),
    ).fit()
    assert results.errors == []
    fs = s3fs.S3FileSystem(**options)
    (log,) = fs.glob(f"{s3_url}/raystyle/*/mine.csv")
    assert fs.cat(log) == b"1\n2\n"
