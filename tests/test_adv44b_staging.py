"""Adversary (issue 44, item 7): a ``LoggerCallback`` writing beside its trials
(``trial.local_path``) on S3 storage.

The driver's staging folder (``<tmp>/popflow-driver/<hash of the storage URL>/<name>/<trial
folder>``) outlives the run, and trial folders of the same name in an experiment of the
same name get the same folder again. So a script run again under the same name after its
old experiment was deleted from the bucket (a re-run in CI, say) starts with the old
run's staged files: an appending logger's file holds both runs' lines, and files the old
run wrote at its end (``log_trial_end``) reach the new trials' folders before they end.
Ray stages under its session's ``driver_artifacts``, fresh for each run.
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


class _AppendingLogger(LoggerCallback):
    def log_trial_result(self, iteration, trial, result):
        with open(os.path.join(trial.local_path, "log.csv"), "a") as f:
            f.write(f"{result['training_iteration']}\n")


def _three(config):
    for i in range(3):
        tune.report({"s": i})


def _run(url: str, options: dict) -> None:
    results = tune.Tuner(
        _three,
        param_space={},
        run_config=tune.RunConfig(
            name="again",
            storage_path=url,
            storage_options=options,
            verbose=0,
            callbacks=[_AppendingLogger()],
        ),
    ).fit()
    assert results.errors == []


def test_a_new_experiment_does_not_start_with_an_old_ones_staged_files(
    initialised, s3_server, s3_url
):
    _, options = s3_server
    fs = s3fs.S3FileSystem(**options)
    _run(s3_url, options)
    fs.rm(s3_url, recursive=True)  # the old experiment deleted; the script run again
    _run(s3_url, options)
    (log,) = fs.glob(f"{s3_url}/again/*/log.csv")
    assert fs.cat(log) == b"1\n2\n3\n"
