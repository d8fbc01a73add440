"""Ray 2.60's ``ray.train.Checkpoint`` names on popflow's: ``filesystem``, ``path`` and
``get_metadata``/``set_metadata``/``update_metadata``. The metadata is Ray's
``.metadata.json`` in the checkpoint's folder, so it travels with the checkpoint: into
storage (local or S3) and back, and into a PBT clone."""

from __future__ import annotations

import os
import pickle
import tempfile
from typing import Any

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from popflow import run
from popflow.schedulers import PopulationBasedTraining, grid_search
from popflow.tune import Checkpoint, get_checkpoint, get_context, report

pytestmark = pytest.mark.integration


def marked(config: dict[str, Any]) -> None:
    """``score = iteration + a``; each checkpoint's metadata names its trial and iteration,
    and each result says whose checkpoint the trial started from (``restored_from``)."""
    iteration, restored_from = 0, ""
    checkpoint = get_checkpoint()
    if checkpoint is not None:
        meta = checkpoint.get_metadata()
        iteration, restored_from = meta["iteration"], meta["trial"]
    while True:
        iteration += 1
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.txt"), "w") as f:
                f.write(str(iteration))
            ckpt = Checkpoint.from_directory(d)
            ckpt.set_metadata({"trial": get_context().get_trial_id()})
            ckpt.update_metadata({"iteration": iteration})
            report(
                {"score": iteration + config["a"], "restored_from": restored_from},
                checkpoint=ckpt,
            )


def test_metadata_is_a_file_in_the_folder_that_copies_carry(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    ckpt = Checkpoint.from_directory(folder)
    assert ckpt.get_metadata() == {}
    assert isinstance(ckpt.filesystem, LocalFileSystem) and ckpt.path == str(folder)
    ckpt.set_metadata({"epoch": 1, "lr": 0.5})
    ckpt.update_metadata({"lr": 0.1})
    assert ckpt.get_metadata() == {"epoch": 1, "lr": 0.1}
    assert os.path.isfile(folder / ".metadata.json")  # Ray's file
    copy = Checkpoint.from_directory(ckpt.to_directory(str(tmp_path / "copy")))
    assert copy.get_metadata() == {"epoch": 1, "lr": 0.1}
    with ckpt.as_directory() as d:
        assert Checkpoint.from_directory(d).get_metadata()["epoch"] == 1
    assert pickle.loads(pickle.dumps(ckpt)).get_metadata() == {"epoch": 1, "lr": 0.1}
    on_fs = Checkpoint(str(folder), filesystem=fsspec.filesystem("file"))
    assert on_fs.get_metadata()["epoch"] == 1
    with pytest.raises(TypeError, match="not JSON serializable"):
        ckpt.set_metadata({"f": object()})
    with pytest.raises(TypeError, match="`metadata` must be a dict, got list"):
        ckpt.set_metadata([1])
    with pytest.raises(TypeError, match="popflow takes an fsspec filesystem"):
        Checkpoint(str(folder), filesystem=object())
    assert ckpt.get_metadata() == {"epoch": 1, "lr": 0.1}  # the failed sets changed nothing


def test_a_reported_checkpoints_metadata_is_in_storage(tune_env):
    grid = run(
        marked,
        {"a": 1},
        metric="score",
        mode="max",
        stop={"training_iteration": 3},
        name="meta",
        verbose=0,
        **tune_env,
    )
    (result,) = grid
    assert result.checkpoint.get_metadata() == {"trial": result.trial_id, "iteration": 3}
    assert [c.get_metadata()["iteration"] for c, _ in result.best_checkpoints] == [1, 2, 3]
    with pytest.raises(ValueError, match="is published, and a published checkpoint never"):
        result.checkpoint.set_metadata({"later": True})
    assert result.checkpoint.get_metadata()["iteration"] == 3  # unchanged


def test_a_pbt_clone_starts_from_a_checkpoint_with_its_sources_metadata(tune_env):
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=1,
        hyperparam_mutations={"a": [1, 3]},
        quantile_fraction=0.5,
        synch=True,
    )
    grid = run(
        marked,
        {"a": grid_search([1, 3])},
        scheduler=pbt,
        metric="score",
        mode="max",
        stop={"training_iteration": 3},
        name="meta-pbt",
        seed=0,
        verbose=0,
        **tune_env,
    )
    ids = {r.trial_id for r in grid}
    cloned = [
        (r.trial_id, h["restored_from"])
        for r in grid
        for h in r.history
        if h["restored_from"] not in ("", r.trial_id)
    ]
    # the worse trial was cloned from the better: it started from that one's checkpoint,
    # whose metadata names the better trial
    assert cloned and all(source in ids - {target} for target, source in cloned)


def test_metadata_travels_through_s3(s3_server, s3_url, dask_cluster, prefect_server, tmp_path):
    _, options = s3_server
    grid = run(
        marked,
        {"a": 1},
        metric="score",
        mode="max",
        stop={"training_iteration": 2},
        name="meta-s3",
        storage=s3_url,
        storage_options=options,
        dask_address=dask_cluster,
        verbose=0,
    )
    (result,) = grid
    ckpt = result.checkpoint
    assert ckpt.path.startswith("s3://") and ckpt.filesystem.protocol[0] in ("s3", "s3a")
    assert ckpt.get_metadata() == {"trial": result.trial_id, "iteration": 2}
    local = ckpt.to_directory(str(tmp_path / "down"))
    assert Checkpoint.from_directory(local).get_metadata()["iteration"] == 2
    # Ray's spelling: a path on the filesystem, without its scheme
    on_fs = Checkpoint(ckpt.path[len("s3://") :], filesystem=ckpt.filesystem)
    assert on_fs.path == ckpt.path and on_fs.get_metadata()["iteration"] == 2
    with pytest.raises(ValueError, match="a published checkpoint never changes"):
        ckpt.update_metadata({"later": True})
