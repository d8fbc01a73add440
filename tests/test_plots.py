"""Plots of an experiment (``popflow.flows.plots.figures``, ``popflow plot``): the data they
show, checked exactly against the experiment's own logs, and the PNGs themselves."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from popflow import ResultGrid, choice, run, uniform
from popflow.flows.api.cli import main
from popflow.flows.experiment.results import Result
from popflow.flows.plots.data import NoMetric, PlotData, PlotKind, Trace, plot_data, plot_kind
from popflow.flows.plots.figures import (
    PlotsUnavailable,
    figure,
    figure_size_px,
    plot_experiment,
    render,
)
from popflow.flows.plots.reading import ExperimentSnapshot, NoExperiment, read_experiment
from popflow.infra.storage.folder import Storage
from popflow.schedulers import ASHAScheduler, PopulationBasedTraining
from popflow.tasks import Trainable

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STOP_AT = 8


class Climber(Trainable):
    """Climbs ``lr`` per iteration (1.5 times that with "adam"); the height is its state."""

    def setup(self, config: dict[str, Any]) -> None:
        self.height = 0.0

    def step(self) -> dict[str, Any]:
        self.height += self.config["lr"] * (1.5 if self.config.get("opt") == "adam" else 1.0)
        return {"score": self.height}

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {"height": self.height}

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.height = checkpoint["height"]


def pbt_scheduler() -> PopulationBasedTraining:
    return PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=2,
        quantile_fraction=0.25,
        hyperparam_mutations={"lr": [0.1, 0.3, 0.5, 0.7, 0.9], "opt": ["sgd", "adam"]},
        synch=True,
    )


@pytest.fixture(scope="module")
def experiments(prefect_server, dask_cluster, tmp_path_factory) -> dict[str, str]:
    """Three small experiments: synch PBT (finished), ASHA (finished), PBT cut short."""
    storage = str(tmp_path_factory.mktemp("plots") / "results")
    common = {
        "metric": "score",
        "mode": "max",
        "stop": {"training_iteration": STOP_AT},
        "seed": 3,
        "storage": storage,
        "dask_address": dask_cluster,
    }
    space = {"lr": uniform(0.05, 1.0), "opt": choice(["sgd", "adam"])}
    run(Climber, space, scheduler=pbt_scheduler(), num_samples=4, name="pbt", **common)
    asha = ASHAScheduler(grace_period=1, reduction_factor=2, max_t=STOP_AT)
    run(Climber, {"lr": uniform(0.05, 1.0)}, scheduler=asha, num_samples=6, name="asha", **common)
    run(
        Climber,
        space,
        scheduler=pbt_scheduler(),
        num_samples=4,
        name="running",
        max_rounds=2,
        **common,
    )
    return {name: os.path.join(storage, name) for name in ("pbt", "asha", "running")}


# -- the experiment's own logs, read independently of popflow.flows.plots.figures ----------


def logged_results(path: str) -> dict[str, list[dict[str, Any]]]:
    """Each trial's result.json lines, by trial id."""
    out = {}
    for d in sorted(Path(path).glob("Climber_*")):
        lines = (d / "result.json").read_text().splitlines()
        results = [json.loads(line) for line in lines]
        out[results[0]["trial_id"]] = results
    return out


def logged_exploits(path: str) -> list[list[Any]]:
    text = (Path(path) / "pbt_global.txt").read_text()
    return [json.loads(line) for line in text.splitlines()]


def trial_of_tag(results: dict[str, list[dict[str, Any]]], tag: str) -> str:
    """Ray's tags start with the trial's index; trial ids end with it."""
    index = int(tag.split("_")[0])
    return next(t for t in results if int(t.rsplit("_", 1)[1]) == index)


def png_pixels(path: str | io.BytesIO) -> np.ndarray:
    import matplotlib.image

    if isinstance(path, io.BytesIO):
        assert path.getvalue()[:8] == PNG_MAGIC
    else:
        with open(path, "rb") as f:
            assert f.read(8) == PNG_MAGIC
    return matplotlib.image.imread(path)


def assert_drawn(data: PlotData, png: bytes | str) -> None:
    """A PNG of the size chosen for ``data``, not blank."""
    pixels = png_pixels(io.BytesIO(png) if isinstance(png, bytes) else png)
    width, height = figure_size_px(data)
    assert pixels.shape[:2] == (height, width)
    assert float(pixels[..., :3].var()) > 0


# -- PBT ---------------------------------------------------------------------------


@pytest.mark.integration
def test_pbt_data_has_every_logged_exploit(experiments):
    path = experiments["pbt"]
    results, lines = logged_results(path), logged_exploits(path)
    assert lines, "the test experiment should exploit"
    data = plot_data(read_experiment(path))
    assert data.kind == PlotKind.POPULATION
    assert (data.metric, data.mode, data.finished) == ("score", "max", True)
    assert data.trials == tuple(sorted(results))
    assert len(data.exploits) == len(lines)
    for mark, (target_tag, source_tag, target_iter, source_iter, _, new_config) in zip(
        data.exploits, lines, strict=True
    ):
        assert mark.target == trial_of_tag(results, target_tag)
        assert mark.source == trial_of_tag(results, source_tag)
        assert (mark.target_iteration, mark.source_iteration) == (target_iter, source_iter)
        source = next(r for r in results[mark.source] if r["training_iteration"] == source_iter)
        assert mark.source_at[0] == source_iter
        assert mark.source_at[1]["score"] == source["score"]
        assert mark.source_at[1]["lr"] == source["config"]["lr"]
        # synch PBT: the clone's next result is one iteration on, with the new config
        assert mark.target_at[0] == target_iter + 1
        assert mark.target_at[1]["lr"] == new_config["lr"]
        clone = next(
            r
            for r in results[mark.target]
            if r["training_iteration"] == target_iter + 1 and r["config"] == new_config
        )
        assert mark.target_at[1]["score"] == clone["score"]


@pytest.mark.integration
def test_pbt_panels_are_the_mutated_keys_and_the_metric(experiments):
    path = experiments["pbt"]
    results, lines = logged_results(path), logged_exploits(path)
    changed = {
        k
        for rs in results.values()
        for k in rs[0]["config"]
        if any(r["config"][k] != rs[0]["config"][k] for r in rs)
    }
    data = plot_data(read_experiment(path))
    assert set(data.panels) == {"score"} | changed
    # a categorical axis in the order of the mutation's list
    assert data.categories.get("opt", ("sgd", "adam")) == ("sgd", "adam")
    # one line per trial, and one more per exploit after which its target reported
    lines_expected = len(results) + sum(
        1
        for line in lines
        if results[trial_of_tag(results, line[0])][-1]["training_iteration"] > line[2]
    )
    assert len(data.panels["score"]) == lines_expected
    points = sorted(
        (t.trial_id, x, y)
        for t in data.panels["score"]
        for x, y in zip(t.times, t.values, strict=True)
    )
    logged = sorted(
        (tid, float(r["training_iteration"]), r["score"]) for tid, rs in results.items() for r in rs
    )
    assert points == logged


@pytest.mark.integration
def test_running_experiment_is_plotted_as_of_its_latest_commit(experiments):
    path = experiments["running"]
    data = plot_data(read_experiment(path))
    assert not data.finished and data.round == 2
    assert len(data.exploits) == len(logged_exploits(path))
    assert max(x for t in data.panels["score"] for x in t.times) == 4  # 2 rounds of 2
    (png,) = plot_experiment(path)
    assert png_pixels(png).shape[:2] == figure_size_px(data)[::-1]


# -- ASHA --------------------------------------------------------------------------


@pytest.mark.integration
def test_pbt_best_lineage_follows_the_committed_lineage(experiments):
    """The bold path is the best trial's lineage: the trials its commit's lineage names,
    oldest first, its results at every iteration up to its last."""
    from popflow.flows.experiment.reading import read_committed

    path = experiments["pbt"]
    data = plot_data(read_experiment(path))
    results = logged_results(path)
    best = max(results, key=lambda t: results[t][-1]["score"])
    assert data.best == best
    (committed,) = [t for t in read_committed(path).commit["trials"] if t["trial_id"] == best]
    chain = committed["lineage"]
    expected = [trial_of_tag(results, chain[0][1])] if chain else []
    expected += [trial_of_tag(results, e[0]) for e in chain] or [best]
    assert data.lineage_trials == tuple(expected)
    score = data.lineage["score"]
    assert score.times == tuple(float(i) for i in range(1, STOP_AT + 1))
    assert score.values[-1] == results[best][-1]["score"]
    # the run's mutations as its arguments recorded them: lists are categorical axes
    assert read_experiment(path).choices == {
        "lr": (0.1, 0.3, 0.5, 0.7, 0.9),
        "opt": ("sgd", "adam"),
    }


@pytest.mark.integration
def test_asha_plot_highlights_the_best_trial_and_takes_a_log_y_axis(experiments, tmp_path):
    data = plot_data(read_experiment(experiments["asha"]))
    results = logged_results(experiments["asha"])
    assert data.best == max(results, key=lambda t: results[t][-1]["score"])
    (ax,) = figure(data, log_y=True).axes
    assert ax.get_yscale() == "log"
    bold = [line for line in ax.get_lines() if line.get_linewidth() > 2]
    assert [tuple(line.get_xdata()) for line in bold] == [
        t.times for t in data.panels["score"] if t.trial_id == data.best
    ]
    assert main(["plot", experiments["asha"], "--log-y", "--out", str(tmp_path)]) == 0
    assert_drawn(data, str(tmp_path / "metric.png"))


@pytest.mark.integration
def test_asha_data_has_its_milestones_and_stopped_trials(experiments):
    path = experiments["asha"]
    results = logged_results(path)
    data = plot_data(read_experiment(path))
    assert data.kind == PlotKind.EARLY_STOPPING
    # grace_period * reduction_factor**k up to max_t, as the committed state has them
    assert data.rungs == (1.0, 2.0, 4.0, 8.0) and not data.rungs_inferred
    stopped = {
        tid: (float(rs[-1]["training_iteration"]), rs[-1]["score"])
        for tid, rs in results.items()
        if rs[-1]["training_iteration"] < STOP_AT
    }
    assert stopped, "the test experiment should stop trials early"
    assert {s.trial_id: (s.time, s.value) for s in data.stops} == stopped
    assert all(s.status == "TERMINATED" and s.time in data.rungs for s in data.stops)
    assert len(data.panels["score"]) == len(results)


# -- the PNGs ----------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize(("name", "png"), [("pbt", "population.png"), ("asha", "metric.png")])
def test_pngs_are_images_of_the_chosen_size(experiments, name, png):
    path = experiments[name]
    written = plot_experiment(path)
    assert written == [os.path.join(path, "plots", png)]
    assert_drawn(plot_data(read_experiment(path)), written[0])


@pytest.mark.integration
def test_plots_go_through_storage_to_s3(experiments, s3_server, s3_url):
    _, options = s3_server
    Storage(s3_url, options).put_dir(experiments["pbt"], "pbt")
    (url,) = plot_experiment(f"{s3_url}/pbt", options)
    assert url == f"{s3_url}/pbt/plots/population.png"
    assert Storage(s3_url, options).read_bytes("pbt", "plots", "population.png")[:8] == PNG_MAGIC


# -- the command line --------------------------------------------------------------


@pytest.mark.integration
def test_cli_prints_each_png(experiments, tmp_path, capsys):
    assert main(["plot", experiments["asha"], "--out", str(tmp_path / "figs")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [str(tmp_path / "figs" / "metric.png")]
    assert png_pixels(out[0]).size > 0


@pytest.mark.unit
def test_cli_missing_experiment_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["plot", str(tmp_path / "nothing")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err == f"popflow: no committed experiment at {tmp_path / 'nothing'}\n"


@pytest.mark.unit
def test_cli_without_matplotlib_exits_2_with_the_hint(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    with pytest.raises(PlotsUnavailable, match=r"pip install 'popflow\[plots\]'"):
        plot_experiment(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["plot", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "pip install 'popflow[plots]'" in err[0]


@pytest.mark.system
def test_import_leaves_matplotlib_unloaded():
    code = "import sys, popflow.flows.plots.figures, popflow.flows.api.cli; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- the pure part, on hand-made experiments ---------------------------------------


def result(trial_id: str, history: list[dict[str, Any]], status: str = "TERMINATED") -> Result:
    return Result(
        config=history[-1]["config"] if history else {},
        metrics=history[-1] if history else {},
        checkpoint=None,
        path="",
        trial_id=trial_id,
        status=status,
        history=history,
    )


def row(it: int, score: float, timestamp: int = 0, **config: Any) -> dict[str, Any]:
    return {"training_iteration": it, "score": score, "timestamp": timestamp, "config": config}


def snapshot(scheduler: str, results: list[Result], **kwargs: Any) -> ExperimentSnapshot:
    defaults = {"name": "hand", "scheduler_state": {}, "metric": "score", "mode": "max"}
    return ExperimentSnapshot(
        scheduler=scheduler, grid=ResultGrid(results, "score", "max", ""), **{**defaults, **kwargs}
    )


@pytest.mark.unit
def test_async_exploit_breaks_the_line_where_time_goes_back():
    # b (iteration 3) clones a (iteration 1): its next result is iteration 2 again
    a = result("a", [row(1, 5.0, 10, lr=0.5, opt="x"), row(2, 6.0, 30, lr=0.5, opt="x")])
    b = result(
        "b",
        [
            row(1, 1.0, 10, lr=0.1, opt="x"),
            row(2, 2.0, 11, lr=0.1, opt="x"),
            row(3, 3.0, 12, lr=0.1, opt="x"),
            row(2, 5.5, 20, lr=0.4, opt="y"),
        ],
    )
    c = result("c", [row(1, 0.0, 10, lr=0.2, opt="x")], status="RUNNING")
    policy = (
        ("1_lr=0.1", "0_lr=0.5", 3, 1, {"lr": 0.5, "opt": "x"}, {"lr": 0.4, "opt": "y"}),
        # c cloned a after its last result: no result of c after it yet
        ("2_lr=0.2", "0_lr=0.5", 1, 2, {"lr": 0.5, "opt": "x"}, {"lr": 0.9, "opt": "x"}),
    )
    tags = {"0": "a", "1": "b", "2": "c"}  # by index only: the tags' heads find the trials
    data = plot_data(snapshot("PopulationBasedTraining", [a, b, c], policy=policy, tags=tags))
    assert list(data.panels) == ["score", "lr", "opt"]
    assert data.categories == {"opt": ("x", "y")}
    assert [(t.trial_id, t.times, t.values) for t in data.panels["score"]] == [
        ("a", (1.0, 2.0), (5.0, 6.0)),
        ("b", (1.0, 2.0, 3.0), (1.0, 2.0, 3.0)),
        ("b", (2.0,), (5.5,)),
        ("c", (1.0,), (0.0,)),
    ]
    assert [t.values for t in data.panels["opt"]] == [(0.0, 0.0), (0.0, 0.0, 0.0), (1.0,), (0.0,)]
    first, second = data.exploits
    assert (first.target, first.source) == ("b", "a")
    assert first.source_at == (1.0, {"score": 5.0, "lr": 0.5, "opt": 0.0})
    assert first.target_at == (2.0, {"score": 5.5, "lr": 0.4, "opt": 1.0})
    assert (second.target, second.source) == ("c", "a")
    assert second.source_at == (2.0, {"score": 6.0, "lr": 0.5, "opt": 0.0})
    assert second.target_at == (2.0, {"score": 6.0, "lr": 0.9, "opt": 0.0})
    assert (first.pending, second.pending) == (False, True)
    (png,) = render(data).values()
    assert_drawn(data, png)


@pytest.mark.unit
def test_hyperband_rungs_are_inferred_from_where_trials_stopped():
    results = [
        result("a", [row(i, float(i)) for i in range(1, 10)]),
        result("b", [row(i, 0.5 * i) for i in range(1, 4)]),
        result("c", [row(1, 0.1)]),
        result("d", [row(1, 0.2), row(2, 0.3)], status="PAUSED"),
        result("e", [row(1, 0.0)], status="ERROR"),
    ]
    data = plot_data(snapshot("HyperBandScheduler", results))
    assert data.kind == PlotKind.EARLY_STOPPING
    assert data.rungs == (1.0, 2.0, 3.0) and data.rungs_inferred
    assert [(s.trial_id, s.time, s.status) for s in data.stops] == [
        ("b", 3.0, "TERMINATED"),
        ("c", 1.0, "TERMINATED"),
        ("e", 1.0, "ERROR"),
    ]
    assert plot_data(snapshot("FIFOScheduler", results)).rungs == ()
    assert list(render(data)) == ["metric.png"]
    assert_drawn(data, render(data)["metric.png"])


@pytest.mark.unit
def test_kind_follows_the_recorded_scheduler():
    assert plot_kind("PB2", {}) == PlotKind.POPULATION
    assert plot_kind("MyPBT", {"trials": [{"trial_id": "a", "orig_tag": "0"}]}) == (
        PlotKind.POPULATION
    )
    for name in ("AsyncHyperBandScheduler", "HyperBandScheduler", "MedianStoppingRule"):
        assert plot_kind(name, {}) == PlotKind.EARLY_STOPPING


@pytest.mark.unit
def test_no_metric_says_what_to_pass():
    with pytest.raises(NoMetric, match=r"records no metric to plot: give one"):
        plot_data(snapshot("FIFOScheduler", [], metric=None))
    assert plot_data(snapshot("FIFOScheduler", [], metric=None), metric="score").metric == "score"


@pytest.mark.unit
def test_missing_experiment_raises(tmp_path):
    with pytest.raises(NoExperiment, match="no committed experiment at"):
        read_experiment(tmp_path / "nothing")


@pytest.mark.unit
def test_pbt_lineage_goes_back_through_each_exploit_and_is_drawn_bold():
    """c cloned a at a's iteration 2, a had cloned b at b's iteration 1: c's lineage is
    b up to 1, a from 2 up to 2, then c from 3; the figure draws that path bold, the
    categorical key on a categorical axis in its list's order."""
    b = result("b", [row(1, 1.0, 1, lr=0.1, f=2), row(2, 1.5, 2, lr=0.1, f=2)])
    a = result("a", [row(1, 0.5, 1, lr=0.2, f=1), row(2, 2.0, 3, lr=0.3, f=1)])
    c = result(
        "c",
        [row(1, 0.1, 1, lr=0.4, f=2), row(2, 0.2, 3, lr=0.4, f=2), row(3, 3.0, 5, lr=0.5, f=1)],
    )
    policy = (
        ("0", "1", 1, 1, {"lr": 0.1, "f": 2}, {"lr": 0.3, "f": 1}),  # a <- b after iteration 1
        ("2", "0", 2, 2, {"lr": 0.3, "f": 1}, {"lr": 0.5, "f": 1}),  # c <- a after iteration 2
    )
    tags = {"0": "a", "1": "b", "2": "c"}
    choices = {"f": (2, 1)}
    data = plot_data(
        snapshot("PopulationBasedTraining", [a, b, c], policy=policy, tags=tags, choices=choices)
    )
    assert data.best == "c" and data.lineage_trials == ("b", "a", "c")
    assert data.lineage["score"] == Trace("c", (1.0, 2.0, 3.0), (1.0, 2.0, 3.0))
    assert data.lineage["lr"].values == (0.1, 0.3, 0.5)
    assert data.categories == {"f": ("2", "1")}  # numbers from a list: categories
    assert data.lineage["f"].values == (0.0, 1.0, 1.0)
    fig = figure(data)
    by_title = {ax.get_title(loc="left"): ax for ax in fig.axes}
    f_axis = by_title["hyperparameter f"]
    assert [t.get_text() for t in f_axis.get_yticklabels()] == ["2", "1"]
    for key, ax in (("score", by_title["score per trial"]), ("lr", by_title["hyperparameter lr"])):
        (bold,) = [line for line in ax.get_lines() if line.get_linewidth() > 2]
        assert tuple(bold.get_ydata()) == data.lineage[key].values
    assert_drawn(data, render(data)["population.png"])


@pytest.mark.unit
def test_an_all_errored_experiment_says_its_trials_errored():
    boom = "Traceback (most recent call last):\n  ...\nRuntimeError: the loss is nan at step 3\n"
    results = [
        Result({}, {}, None, "", error=boom, trial_id="a", status="ERROR", history=[]),
        Result({}, {}, None, "", error=None, trial_id="b", status="ERROR", history=[]),
    ]
    data = plot_data(snapshot("AsyncHyperBandScheduler", results))
    assert (data.errored, data.first_error) == (2, "RuntimeError: the loss is nan at step 3")
    fig = figure(data)
    said = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert said == ["2 of 2 trials errored; the first: RuntimeError: the loss is nan at step 3"]
    assert "2 errored" in fig.get_suptitle()
