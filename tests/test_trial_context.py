"""Ray's ``tune.get_context()`` inside trials (function and class trainables, their
setup too) and ``setup_mlflow``: a run per trial, opened in the trainable, with the
config as params, ended with the trial, in the experiment the arguments (or
``config["mlflow"]``) name."""

from __future__ import annotations

from typing import Any

import mlflow
import pytest
from mlflow.tracking import MlflowClient

import popflow
from popflow import tune
from popflow.air.integrations.mlflow import setup_mlflow

pytestmark = pytest.mark.unit

SEEN: list[tuple[str, ...]] = []


def context_names() -> tuple[str, ...]:
    ctx = tune.get_context()
    return (ctx.get_trial_id(), ctx.get_trial_name(), ctx.get_experiment_name())


def reporting(config: dict[str, Any]) -> None:
    SEEN.append(("function", *context_names()))
    tune.report({"score": 1.0})


class Stepping(tune.Trainable):
    def setup(self, config: dict[str, Any]) -> None:
        SEEN.append(("setup", *context_names()))

    def step(self) -> dict[str, Any]:
        SEEN.append(("step", *context_names()))
        return {"score": 1.0}


def simulate(tmp_path, trainable: Any, space: dict[str, Any], **kwargs: Any) -> Any:
    return popflow.simulate(
        trainable,
        space,
        metric="score",
        mode="max",
        storage=str(tmp_path),
        name="ctx",
        **{"stop": {"training_iteration": 1}, **kwargs},
    )


@pytest.mark.parametrize("trainable", [reporting, Stepping], ids=["function", "class"])
def test_a_trial_knows_its_id_name_and_experiment(tmp_path, trainable):
    SEEN.clear()
    sim = simulate(tmp_path, trainable, {"x": tune.grid_search([1, 2])})
    names = {r.trial_id: str(r.path).rsplit("/", 1)[-1] for r in sim.grid}
    assert {s[1] for s in SEEN} == set(names)
    assert {s[3] for s in SEEN} == {"ctx"}
    assert all(s[2] and s[2] != "" for s in SEEN)
    assert {s[0] for s in SEEN} == ({"function"} if trainable is reporting else {"setup", "step"})


def test_outside_a_trial_get_context_raises():
    with pytest.raises(RuntimeError, match="inside a trial"):
        tune.get_context()


@pytest.fixture
def tracking(tmp_path):
    """A SQLite tracking store; the process's tracking URI is put back afterwards."""
    before = mlflow.get_tracking_uri()
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    yield uri
    mlflow.set_tracking_uri(before)


def logging_fn(config: dict[str, Any]) -> None:
    ml = setup_mlflow(config)
    for step in range(2):
        ml.log_metrics({"loss": config["x"] / (step + 1)}, step=step)
        tune.report({"score": -config["x"] / (step + 1)})


class Logging(tune.Trainable):
    """The same as ``logging_fn`` as a class: every trial's object runs in one thread
    here, so each trial's run must not be the one the thread had open before."""

    def setup(self, config: dict[str, Any]) -> None:
        self.ml, self.x, self.step_ = setup_mlflow(config), config["x"], 0

    def step(self) -> dict[str, Any]:
        self.ml.log_metrics({"loss": self.x / (self.step_ + 1)}, step=self.step_)
        self.step_ += 1
        return {"score": -self.x / self.step_}

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {"step": self.step_}


@pytest.mark.parametrize("trainable", [logging_fn, Logging], ids=["function", "class"])
def test_setup_mlflow_opens_a_run_per_trial_with_its_config_and_ends_it(
    tmp_path, tracking, trainable
):
    space = {"x": tune.grid_search([1.0, 2.0]), "mlflow": {"tracking_uri": tracking}}
    space["mlflow"] |= {"experiment_name": "exp", "create_experiment_if_not_exists": True}
    simulate(tmp_path / "run", trainable, space, stop={"training_iteration": 2})
    client = MlflowClient(tracking_uri=tracking)
    runs = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    assert sorted(r.data.params["x"] for r in runs) == ["1.0", "2.0"]
    assert all("mlflow/tracking_uri" not in r.data.params for r in runs)
    assert {r.info.status for r in runs} == {"FINISHED"}  # ended with their trials
    assert len({r.data.tags["trial_name"] for r in runs}) == 2
    for run in runs:
        x = float(run.data.params["x"])
        losses = [m.value for m in client.get_metric_history(run.info.run_id, "loss")]
        assert losses == [x, x / 2]


def _save_fails(self: Any, checkpoint_dir: str) -> None:
    raise RuntimeError("the disk is gone")


def test_a_failed_trials_run_ends_failed(tmp_path, tracking):
    space = {"x": tune.grid_search([1.0, 2.0]), "mlflow": {"tracking_uri": tracking}}
    space["mlflow"] |= {"experiment_name": "exp", "create_experiment_if_not_exists": True}
    fails = type("SaveFails", (Logging,), {"save_checkpoint": _save_fails})
    simulate(tmp_path, fails, space)  # its save at the end raises: both trials fail
    client = MlflowClient(tracking_uri=tracking)
    runs = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    assert [r.info.status for r in runs] == ["FAILED", "FAILED"]


def test_setup_mlflow_without_an_experiment_is_named(tmp_path, tracking):
    space = {"x": 1.0, "mlflow": {"tracking_uri": tracking, "experiment_name": "nowhere"}}
    sim = simulate(tmp_path, logging_fn, space)
    (result,) = list(sim.grid)
    assert "setup_mlflow found no MLflow experiment" in str(result.error)
