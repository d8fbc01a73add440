"""resources_per_trial maps to Dask worker resources and fails fast when nothing fits."""

from __future__ import annotations

import pytest
from trainables import NoCheckpointTrainable

from popflow import run
from popflow.infra.cluster.dask_cluster import dask_resources


@pytest.mark.unit
def test_resource_names_follow_ray():
    assert dask_resources({"cpu": 2, "gpu": 0.5, "tpu_pod": 1}) == {
        "CPU": 2.0,
        "GPU": 0.5,
        "tpu_pod": 1.0,
    }
    assert dask_resources({"cpu": 0}) is None
    with pytest.raises(ValueError, match=r"`resources_per_trial\['gpu'\]` is -1"):
        dask_resources({"gpu": -1})


@pytest.mark.integration
def test_trial_that_fits_runs(prefect_server, tmp_path):
    results = run(
        NoCheckpointTrainable,
        num_samples=3,
        stop={"training_iteration": 2},
        resources_per_trial={"cpu": 1},
        n_workers=2,
        storage=str(tmp_path),
        name="fits",
    )
    assert [r.metrics["training_iteration"] for r in results] == [2, 2, 2]


@pytest.mark.integration
def test_trial_that_fits_nowhere_fails_fast(tune_env):
    # raised before any segment is submitted: Dask would otherwise queue the task forever
    with pytest.raises(ValueError, match=r"no Dask worker can run a trial needing \{'GPU': 1.0\}"):
        run(
            NoCheckpointTrainable,
            num_samples=1,
            stop={"training_iteration": 1},
            resources_per_trial={"gpu": 1},
            name="gpu",
            **tune_env,
        )


@pytest.mark.integration
def test_embedded_cluster_declares_its_cores(prefect_server, tmp_path):
    with pytest.raises(ValueError, match="workers offer"):
        run(
            NoCheckpointTrainable,
            num_samples=1,
            stop={"training_iteration": 1},
            resources_per_trial={"cpu": 64},
            n_workers=2,
            storage=str(tmp_path),
            name="toomany",
        )
