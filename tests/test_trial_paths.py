"""Ray 2.60's ``Trial.local_path`` and ``Trial.path`` for a ``LoggerCallback`` writing beside
the trial: ``local_path`` is a folder on the driver whose files reach the trial's folder in
storage (the folder itself on local disk; a staging folder copied up on S3). Ray's guide's
custom logger runs as written."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import pytest

from popflow import run
from popflow.schedulers import Trial, grid_search
from popflow.schedulers.trial import driver_folder
from popflow.tune import report
from popflow.tune.logger import LoggerCallback

pytestmark = pytest.mark.integration


class CustomLoggerCallback(LoggerCallback):
    """Ray's guide (tune-output, "How to Build Custom Tune Loggers?"), as written there."""

    def __init__(self, filename: str = "log.txt"):
        self._trial_files = {}
        self._filename = filename

    def log_trial_start(self, trial: Trial):
        trial_logfile = os.path.join(trial.local_path, self._filename)
        self._trial_files[trial] = open(trial_logfile, "at")  # noqa: SIM115, UP015 (Ray's snippet)

    def log_trial_result(self, iteration: int, trial: Trial, result: dict):
        if trial in self._trial_files:
            self._trial_files[trial].write(json.dumps(result))

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial, **info):
        if trial in self._trial_files:
            self._trial_files[trial].close()
            del self._trial_files[trial]


def counting(config: dict[str, Any]) -> None:
    for i in range(3):
        report({"score": i * config["x"]})


def logged_iterations(text: str) -> list[int]:
    """The ``training_iteration`` of each result the callback wrote (JSON objects back to
    back, as Ray's snippet writes them)."""
    decoder, out, at = json.JSONDecoder(), [], 0
    while at < len(text):
        result, at = decoder.raw_decode(text, at)
        out.append(result["training_iteration"])
    return out


@pytest.fixture
def staged_here(tmp_path, monkeypatch):
    """The driver's staging folders under this test's folder."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    os.makedirs(tmp_path / "tmp")


def test_local_path_is_the_trials_folder_on_local_disk_and_staged_for_a_url(tmp_path, staged_here):
    assert Trial("t", {}).local_path is None  # no folder yet (the driver sets path)
    local = Trial("t", {}, path=str(tmp_path / "exp" / "t_0"))
    assert local.local_path == local.path and os.path.isdir(local.path)  # made on first use
    assert local.local_experiment_path == local.local_dir == str(tmp_path / "exp")
    with pytest.warns(DeprecationWarning, match="Use `local_path` instead of `logdir`"):
        assert local.logdir == local.path
    remote = Trial("t", {}, path="s3://bucket/prefix/exp/t_0")
    staged = remote.local_path
    assert staged == driver_folder(remote.path) and os.path.isdir(staged)
    assert staged.startswith(str(tmp_path / "tmp" / "popflow-driver"))
    assert staged.endswith(os.path.join("exp", "t_0")) and "://" not in staged
    # another bucket's experiment of the same name: another staging folder
    assert driver_folder("s3://other/prefix/exp/t_0") != staged


def test_rays_custom_logger_writes_beside_each_trial(tune_env):
    grid = run(
        counting,
        {"x": grid_search([1, 2])},
        metric="score",
        mode="max",
        name="logged",
        callbacks=[CustomLoggerCallback()],
        verbose=0,
        **tune_env,
    )
    for result in grid:
        with open(os.path.join(result.path, "log.txt")) as f:
            assert logged_iterations(f.read()) == [1, 2, 3]


def test_on_s3_the_staged_files_are_copied_into_the_trials_folder(
    s3_server, s3_url, dask_cluster, prefect_server, staged_here
):
    import s3fs

    _, options = s3_server
    grid = run(
        counting,
        {"x": grid_search([1, 2])},
        metric="score",
        mode="max",
        name="logged-s3",
        storage=s3_url,
        storage_options=options,
        dask_address=dask_cluster,
        callbacks=[CustomLoggerCallback()],
        verbose=0,
    )
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    for result in grid:
        assert result.path.startswith("s3://")
        text = fs.cat_file(f"{result.path}/log.txt").decode()
        assert logged_iterations(text) == [1, 2, 3]
