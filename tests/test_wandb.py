"""Ray's W&B integration in W&B's offline mode, read back from the runs' record files:
``WandbLoggerCallback`` (a run per trial from the driver) and ``setup_wandb`` (a run
opened in the trainable), with Ray's rules for what is logged, and a run's end."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.wandb_runs import offline_runs

import popflow
from popflow import tune
from popflow.air.integrations.wandb import WandbLoggerCallback, setup_wandb

# W&B runs its own service process beside the one that logs
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def offline(tmp_path_factory) -> Iterator[str]:
    """Offline mode in one folder for the module (W&B reads it once a process)."""
    where = tmp_path_factory.mktemp("wandb-dir")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WANDB_MODE", "offline")
        env.setenv("WANDB_DIR", str(where))
        env.setenv("WANDB_SILENT", "true")
        yield str(where)
    import wandb

    wandb.teardown()  # its service process (wandb-core) lives until told, past the tests


def objective(config: dict[str, Any]) -> None:
    for step in range(3):
        tune.report({"score": config["x"] * (step + 1), "secret": 1.0, "nested": {"a": 2.0}})


def simulate(tmp_path, name: str, trainable: Any, space: dict[str, Any], **kwargs: Any) -> Any:
    return popflow.simulate(
        trainable,
        space,
        metric="score",
        mode="max",
        stop={"training_iteration": 3},
        storage=str(tmp_path / "results"),
        name=name,
        **kwargs,
    )


def test_the_callback_logs_each_trials_results_in_its_own_run(tmp_path, offline):
    callback = WandbLoggerCallback(project="p", excludes=["secret"])
    space = {"x": tune.grid_search([1.0, 2.0])}
    sim = simulate(tmp_path, "callback", objective, space, callbacks=[callback])
    runs = offline_runs(offline, "callback")
    assert sorted(runs) == sorted(r.trial_id for r in sim.grid)
    for run in runs.values():
        assert run.exit_code == 0 and run.name.endswith(run.run_id)
        x = run.config["x"]
        logged = [{k: v for k, v in row.items() if not k.startswith("_")} for row in run.history]
        steps = [row["_step"] for row in run.history]
        assert steps == [1, 2, 3]  # training_iteration
        assert [row["score"] for row in logged] == [x, 2 * x, 3 * x]
        assert all(row["nested/a"] == 2.0 for row in logged)
        keys = set().union(*logged)
        assert not keys & {"secret", "done", "should_checkpoint", "trial_id", "config/x"}
        assert run.config["trial_id"] == run.run_id  # Ray's auto keys go to the config


class Saving(tune.Trainable):
    def step(self) -> dict[str, Any]:
        return {"score": float(self.iteration + 1)}

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {"n": self.iteration}


def test_upload_checkpoints_logs_each_checkpoint_folder_as_a_model_artifact(tmp_path, offline):
    callback = WandbLoggerCallback(project="p", upload_checkpoints=True)
    every = tune.CheckpointConfig(checkpoint_frequency=1, checkpoint_at_end=False)
    simulate(tmp_path, "artifacts", Saving, {}, callbacks=[callback], checkpoint_config=every)
    (run,) = offline_runs(offline, "artifacts").values()
    assert run.artifacts == [f"checkpoint_{run.name}"] * 3  # iterations 1, 2 and 3


def test_the_callback_needs_a_project(tmp_path, offline, monkeypatch):
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    with pytest.raises(ValueError, match="project name"):
        simulate(tmp_path, "none", objective, {"x": 1.0}, callbacks=[WandbLoggerCallback()])


def logging_in_the_trial(config: dict[str, Any]) -> None:
    run = setup_wandb(config, project="p")
    for step in range(3):
        run.log({"inside": config["x"] + step})
        if config["x"] < 0 and step == 1:
            raise RuntimeError("a trial that fails")
        tune.report({"score": config["x"] + step})


def test_setup_wandb_opens_the_trials_run_and_ends_it_with_the_trial(tmp_path, offline):
    space = {"x": tune.grid_search([1.0, -1.0])}
    sim = simulate(tmp_path, "inside", logging_in_the_trial, space)
    runs = offline_runs(offline, "inside")
    by_x = {run.config["x"]: run for run in runs.values()}
    assert sorted(runs) == sorted(r.trial_id for r in sim.grid)
    assert [row["inside"] for row in by_x[1.0].history] == [1.0, 2.0, 3.0]
    assert by_x[1.0].exit_code == 0
    assert by_x[-1.0].exit_code == 1  # the failed trial's run ends failed


def test_without_the_extra_the_error_says_what_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ImportError, match=r"popflow\[wandb\]"):
        WandbLoggerCallback(project="p")
