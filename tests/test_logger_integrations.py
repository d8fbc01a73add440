"""Ray's TensorBoard and MLflow logger callbacks, on real runs: the event files and the
MLflow runs are read back with TensorBoard's reader and ``MlflowClient``, and compared
with each trial's ``result.json``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import s3fs
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

from popflow import run
from popflow.air.integrations.mlflow import MLflowLoggerCallback
from popflow.schedulers import Trial, grid_search
from popflow.tasks import Trainable
from popflow.tune.logger import TBXLoggerCallback

NOT_LOGGED = {"config", "pid", "timestamp", "time_total_s", "training_iteration"}


class Nested(Trainable):
    """Nested results and config; raises at iteration ``fail_at``."""

    def step(self) -> dict[str, Any]:
        i = self.iteration + 1
        if i == self.config["fail_at"]:
            raise RuntimeError("boom")
        return {"loss": self.config["lr"] / i, "extra": {"acc": 0.25 * i}, "best": i > 1}

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {}

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        pass


SPACE = {"lr": grid_search([0.5, 0.25]), "fail_at": grid_search([None, 2]), "model": {"w": 8}}


def flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(flat(v, f"{prefix}{k}/") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def rows_of(folder: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(folder, "result.json").read_text().splitlines()]


def scalars_of(rows: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """What TBXLoggerCallback should have written for these results: tag -> (step, value)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        kept = {k: v for k, v in row.items() if k not in NOT_LOGGED}
        for key, value in flat(kept).items():
            if isinstance(value, int | float):
                out.setdefault(f"ray/tune/{key}", []).append(
                    (row["training_iteration"], float(value))
                )
    return out


def check_event_files(folder: str | Path, rows: list[dict[str, Any]], config: dict) -> None:
    """The folder's one event file holds the rows' scalars and the config's hparams."""
    events = sorted(Path(folder).glob("events.out.tfevents.*"))
    assert len(events) == 1, events
    acc = EventAccumulator(str(events[0]))
    acc.Reload()
    expected = scalars_of(rows)
    assert set(acc.Tags()["scalars"]) == set(expected)
    for tag, points in expected.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert got == [(s, pytest.approx(v, rel=1e-6)) for s, v in points], tag
    hparams = acc.PluginTagToContent("hparams")
    start = HParamsPluginData.FromString(hparams["_hparams_/session_start_info"])
    got = {k: v.string_value or v.number_value for k, v in start.session_start_info.hparams.items()}
    assert got == {k: v for k, v in flat(config).items() if v is not None}
    experiment = HParamsPluginData.FromString(hparams["_hparams_/experiment"]).experiment
    assert {m.name.tag for m in experiment.metric_infos} == set(expected)


@pytest.fixture(scope="module")
def logged(prefect_server, dask_cluster, tmp_path_factory):
    """One run of four trials (two raise at iteration 2) with both callbacks."""
    tmp = tmp_path_factory.mktemp("loggers")
    uri = f"sqlite:///{tmp}/mlflow.db"
    MlflowClient(uri).create_experiment("loggers", artifact_location=str(tmp / "artifacts"))
    mlflow_cb = MLflowLoggerCallback(
        uri, experiment_name="loggers", tags={"team": "a"}, save_artifact=True
    )
    results = run(
        Nested,
        SPACE,
        stop={"training_iteration": 3},
        name="loggers",
        storage=str(tmp / "results"),
        dask_address=dask_cluster,
        callbacks=[TBXLoggerCallback(), mlflow_cb],
    )
    return results, MlflowClient(uri)


@pytest.mark.integration
def test_tensorboard_event_files_hold_each_trials_results_and_hparams(logged):
    results, _ = logged
    assert sorted(r.status for r in results) == ["ERROR", "ERROR", "TERMINATED", "TERMINATED"]
    for r in results:
        rows = rows_of(r.path)
        assert [row["training_iteration"] for row in rows] == ([1, 2, 3] if not r.error else [1])
        check_event_files(r.path, rows, r.config)


@pytest.mark.integration
def test_mlflow_has_one_run_per_trial_with_params_metrics_and_status(logged):
    results, client = logged
    experiment = client.get_experiment_by_name("loggers")
    runs = {run.info.run_name: run for run in client.search_runs([experiment.experiment_id])}
    assert sorted(runs) == sorted(f"Nested_{r.trial_id}" for r in results)
    for r in results:
        run_ = runs[f"Nested_{r.trial_id}"]
        assert run_.info.status == ("FAILED" if r.error else "FINISHED")
        assert run_.data.tags["trial_name"] == run_.info.run_name
        assert run_.data.tags["team"] == "a"
        assert run_.data.params == {k: str(v) for k, v in flat(r.config).items()}
        rows = rows_of(r.path)
        numbers = {k for row in rows for k, v in flat(row).items() if isinstance(v, int | float)}
        assert set(run_.data.metrics) == numbers  # config/lr too, as Ray
        for key in ("loss", "extra/acc", "best", "config/lr", "training_iteration"):
            history = client.get_metric_history(run_.info.run_id, key)
            want = [(row["training_iteration"], float(flat(row)[key])) for row in rows]
            assert sorted((m.step, m.value) for m in history) == want, key
        # save_artifact: the trial's folder, as it was once its logs were written
        names = {a.path for a in client.list_artifacts(run_.info.run_id)}
        assert {"result.json", "params.json"} <= names
        art = client.download_artifacts(run_.info.run_id, "result.json")
        assert Path(art).read_text() == Path(r.path, "result.json").read_text()


@pytest.mark.integration
def test_tensorboard_on_s3_copies_the_event_files_into_the_trial_folders(
    prefect_server, dask_cluster, s3_server, s3_url, tmp_path
):
    _, options = s3_server
    results = run(
        Nested,
        {"lr": grid_search([0.5, 0.25]), "fail_at": None},
        stop={"training_iteration": 2},
        name="tbx-s3",
        storage=s3_url,
        storage_options=options,
        dask_address=dask_cluster,
        callbacks=[TBXLoggerCallback(storage_options=options)],
    )
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    for r in results:
        assert r.path.startswith("s3://")
        local = tmp_path / r.trial_id
        fs.get(r.path.removeprefix("s3://") + "/", str(local) + "/", recursive=True)
        check_event_files(local, rows_of(local), r.config)


@pytest.mark.unit
def test_mlflow_resumed_trial_goes_on_in_its_run_and_remote_artifacts(tmp_path):
    """Driven by hand: the run ids are the callback's state; a remote (fsspec) folder's
    files become artifacts at the experiment's end."""
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe({"/trials/t0/result.json": b"{}\n", "/trials/t0/sub/a.txt": b"a"})
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    client.create_experiment("by-hand", artifact_location=str(tmp_path / "artifacts"))
    trial = Trial("t0", {"lr": 0.1}, path="memory://trials/t0")
    first = MLflowLoggerCallback(uri, experiment_name="by-hand", save_artifact=True)
    first.setup()
    first.log_trial_start(trial)
    first.log_trial_result(1, trial, {"training_iteration": 1, "loss": 3.0})
    later = MLflowLoggerCallback(uri, experiment_name="by-hand", save_artifact=True)
    later.set_state(json.loads(json.dumps(first.get_state())))  # as committed
    later.setup()
    later.log_trial_start(trial)
    later.log_trial_result(2, trial, {"training_iteration": 2, "loss": 2.0})
    later.log_trial_end(trial)
    later.on_step_begin(3, [trial])  # remote: not yet
    [run_] = client.search_runs([client.get_experiment_by_name("by-hand").experiment_id])
    assert client.list_artifacts(run_.info.run_id) == []
    later.on_experiment_end([trial])
    run_ = client.get_run(run_.info.run_id)
    assert run_.info.status == "FINISHED" and run_.data.params == {"lr": "0.1"}
    history = client.get_metric_history(run_.info.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 3.0), (2, 2.0)]
    assert sorted(a.path for a in client.list_artifacts(run_.info.run_id)) == ["result.json", "sub"]
    assert later.get_state() == {"runs": {"t0": run_.info.run_id}, "pending": []}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("module", "extra", "make"),
    [
        ("tensorboardX", "tensorboard", TBXLoggerCallback),
        ("mlflow", "mlflow", lambda: MLflowLoggerCallback(experiment_name="x")),
    ],
)
def test_a_missing_extra_says_what_to_install(monkeypatch, module, extra, make):
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    hint = rf"^\w+LoggerCallback needs {module}: pip install 'popflow\[{extra}\]'$"
    with pytest.raises(ImportError, match=hint):
        make()


@pytest.mark.system
def test_importing_the_callbacks_imports_neither_extra():
    code = (
        "import sys, popflow.tune.logger, popflow.air.integrations.mlflow;"
        "print(sorted({'tensorboardX', 'mlflow'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.unit
def test_arguments_are_checked(monkeypatch):
    for var in ("MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="needs `experiment_name`"):
        MLflowLoggerCallback("sqlite:///x.db")
    with pytest.raises(TypeError, match="`tags` must be a dict"):
        MLflowLoggerCallback(experiment_name="x", tags=["a"])
    with pytest.raises(TypeError, match="`storage_options` must be a dict"):
        TBXLoggerCallback(storage_options="s3://x")
