"""flows.results (ResultGrid, Result), the Checkpoint handle and CheckpointConfig, built by hand."""

from __future__ import annotations

import math
import os
import pickle
import re
import uuid
from typing import Any

import fsspec
import pytest
from support.trees import read_tree

from popflow.flows.experiment.results import Result, ResultGrid
from popflow.flows.spec.config import CheckpointConfig
from popflow.infra.store.layout import DICT_CHECKPOINT_FILE
from popflow.tasks.checkpoint import Checkpoint

pytestmark = pytest.mark.unit

NAN, INF = math.nan, math.inf


def trial(tid: str, values: list[float], config: dict[str, Any] | None = None, **kw: Any) -> Result:
    """A Result whose history reports ``score`` = ``values``, one per iteration."""
    history = [
        {"score": v, "training_iteration": i + 1, "trial_id": tid} for i, v in enumerate(values)
    ]
    return Result(
        config=config if config is not None else {"id": tid},
        metrics=dict(history[-1]) if history else {},
        checkpoint=None,
        path=f"/exp/T_{tid}",
        trial_id=tid,
        history=history,
        **kw,
    )


def grid(*results: Result, metric: str | None = "score", mode: str | None = "max") -> ResultGrid:
    return ResultGrid(list(results), metric, mode, "/exp")


# d: high early, then nothing; f: a late burst; g: a long plateau
SCOPED = grid(
    trial("d", [200] * 2 + [0] * 10),  # avg 33.3, last-5 0, last-10 0, last 0, max 200
    trial("f", [0] * 7 + [24] * 5),  # avg 10, last-5 24, last-10 12, last 24
    trial("g", [0] * 2 + [15] * 10),  # avg 12.5, last-5 15, last-10 15, last 15
)


@pytest.mark.parametrize(
    "scope, mode, best",
    [
        ("last", "max", "f"),
        ("last", "min", "d"),
        ("avg", "max", "d"),
        ("avg", "min", "f"),
        ("last-5-avg", "max", "f"),
        ("last-5-avg", "min", "d"),
        ("last-10-avg", "max", "g"),
        ("last-10-avg", "min", "d"),
        ("all", "max", "d"),
        ("all", "min", "d"),  # d and f both reach 0; the first trial wins a tie
    ],
)
def test_best_result_by_scope_and_mode(scope, mode, best):
    assert SCOPED.get_best_result(mode=mode, scope=scope).trial_id == best


def test_best_result_uses_the_grid_defaults_and_overrides():
    g = grid(trial("a", [1, 2]), trial("b", [3, 0]), metric="score", mode="min")
    assert g.get_best_result().trial_id == "b"
    assert g.get_best_result(mode="max").trial_id == "a"
    assert g.get_best_result(metric="training_iteration", mode="max").trial_id == "a"


def test_nan_and_inf_are_filtered_by_default():
    g = grid(trial("ok", [1.0, 2.0]), trial("nan", [5.0, NAN]), trial("inf", [1.0, INF]))
    assert g.get_best_result(scope="last").trial_id == "ok"  # final NaN/inf never wins "last"
    assert g.get_best_result(scope="all").trial_id == "nan"  # its finite 5.0 still counts
    assert g.get_best_result(scope="avg").trial_id == "nan"  # mean of the finite values: 5.0


def test_without_filtering_inf_counts_and_nan_ranks_last():
    g = grid(trial("ok", [1.0, 2.0]), trial("nan", [5.0, NAN]), trial("inf", [1.0, INF]))
    assert g.get_best_result(scope="last", filter_nan_and_inf=False).trial_id == "inf"
    assert g.get_best_result(mode="min", scope="last", filter_nan_and_inf=False).trial_id == "ok"
    only_nan = grid(trial("nan", [NAN, NAN]), trial("ok", [3.0]), mode="min")
    for scope in ("last", "avg", "all"):
        assert only_nan.get_best_result(scope=scope, filter_nan_and_inf=False).trial_id == "ok"


def test_no_finite_value_anywhere_is_an_error():
    g = grid(trial("nan", [NAN]), trial("inf", [INF]))
    with pytest.raises(RuntimeError, match="no trial reported a finite 'score'"):
        g.get_best_result()
    with pytest.raises(RuntimeError, match="no trial reported a 'other'"):
        g.get_best_result(metric="other", filter_nan_and_inf=False)


def test_trials_that_never_reported_the_metric_are_skipped():
    g = grid(trial("none", []), trial("a", [1.0]), mode="min")
    for scope in ("last", "avg", "all"):
        assert g.get_best_result(scope=scope).trial_id == "a"
        assert g.get_best_result(scope=scope, filter_nan_and_inf=False).trial_id == "a"


def test_results_without_history_rank_by_their_final_metrics():
    a = Result(config={}, metrics={"score": 1.0}, checkpoint=None, path="/a", trial_id="a")
    b = Result(config={}, metrics={"score": 2.0}, checkpoint=None, path="/b", trial_id="b")
    for scope in ("last", "avg", "all", "last-5-avg"):
        assert grid(a, b).get_best_result(scope=scope).trial_id == "b"


def test_missing_metric_or_mode_is_a_clear_error():
    g = grid(trial("a", [1.0]), metric=None, mode=None)
    with pytest.raises(ValueError, match=r"no metric/mode to rank trials by: pass get_best_result"):
        g.get_best_result()
    with pytest.raises(ValueError, match="no metric/mode"):
        g.get_best_result(metric="score")
    with pytest.raises(ValueError, match="no metric/mode"):
        g.get_best_result(mode="max")
    assert g.get_best_result(metric="score", mode="max").trial_id == "a"


def test_bad_mode_and_scope_are_value_errors():
    g = grid(trial("a", [1.0]))
    with pytest.raises(ValueError, match=r"`mode` is 'maximum', but must be 'min' or 'max'"):
        g.get_best_result(mode="maximum")
    with pytest.raises(ValueError, match=r"`scope` is 'best', but must be one of \('last', 'avg'"):
        g.get_best_result(scope="best")


# -- dataframe -------------------------------------------------------------------


def test_dataframe_has_last_results_flattened_config_trial_id_and_logdir():
    g = grid(
        trial("a", [1.0, 3.0], config={"lr": 0.1, "model": {"layers": 2, "act": "relu"}}),
        trial("b", [2.0], config={"lr": 0.2, "model": {"layers": 4, "act": "tanh"}}),
    )
    df = g.get_dataframe()
    assert list(df["trial_id"]) == ["a", "b"]
    assert list(df["logdir"]) == ["/exp/T_a", "/exp/T_b"]
    assert list(df["score"]) == [3.0, 2.0]
    assert list(df["training_iteration"]) == [2, 1]
    assert list(df["config/lr"]) == [0.1, 0.2]
    assert list(df["config/model/layers"]) == [2, 4]
    assert list(df["config/model/act"]) == ["relu", "tanh"]
    assert "config/model" not in df.columns


def test_dataframe_filter_metric_picks_each_trials_best_row():
    g = grid(trial("a", [1.0, 5.0, NAN, 2.0]), trial("b", [4.0, 0.5]))
    best = g.get_dataframe(filter_metric="score", filter_mode="max")
    assert list(best["score"]) == [5.0, 4.0]
    assert list(best["training_iteration"]) == [2, 1]
    worst = g.get_dataframe(filter_metric="score", filter_mode="min")
    assert list(worst["score"]) == [1.0, 0.5]
    assert list(g.get_dataframe(filter_metric="score")["score"]) == [5.0, 4.0]  # the grid's mode


def test_dataframe_filter_metric_needs_a_mode():
    g = grid(trial("a", [1.0]), mode=None)
    with pytest.raises(ValueError, match=r"`filter_mode` is None, but must be 'min' or 'max'"):
        g.get_dataframe(filter_metric="score")
    with pytest.raises(ValueError, match=r"`filter_mode` is 'up'"):
        g.get_dataframe(filter_metric="score", filter_mode="up")
    assert list(g.get_dataframe()["score"]) == [1.0]  # no filter, no mode needed


def test_metrics_dataframe_is_the_history():
    r = trial("a", [1.0, 2.0, 3.0])
    assert list(r.metrics_dataframe["score"]) == [1.0, 2.0, 3.0]


# -- the grid as a sequence ------------------------------------------------------


def test_len_iteration_indexing_errors_and_status():
    results = [
        trial("a", [1.0], status="TERMINATED"),
        trial("b", [2.0], status="ERROR", error="Traceback ...\nRuntimeError: boom"),
        trial("c", [3.0], status="TERMINATED"),
    ]
    g = grid(*results)
    assert len(g) == 3
    assert [r.trial_id for r in g] == ["a", "b", "c"]
    assert g[1] is results[1]
    assert g[-1].trial_id == "c"
    assert [str(e) for e in g.errors] == ["Traceback ...\nRuntimeError: boom"]
    assert g.num_errors == 1
    assert g.num_terminated == 2
    assert repr(g) == "ResultGrid(3 trials, 1 errors, at '/exp')"
    assert grid().num_errors == 0 and len(grid()) == 0


# -- read back from storage (real runs: tests/test_cli_status.py) ------------------


@pytest.mark.parametrize("where", ["local", "memory"])
def test_from_path_without_a_commit_is_a_file_not_found_error_naming_the_url(where, tmp_path):
    path = str(tmp_path / "exp") if where == "local" else f"memory://{uuid.uuid4().hex}/exp"
    url = path if where == "local" else path.replace("://", ":///")  # memory's root is "/"
    with pytest.raises(FileNotFoundError, match=f"^no committed experiment at {re.escape(url)}$"):
        ResultGrid.from_path(path)
    fs, root = fsspec.core.url_to_fs(path)
    fs.makedirs(root, exist_ok=True)
    fs.pipe_file(f"{root}/experiment.json", b'{"name": "exp"}')  # started, nothing committed
    with pytest.raises(FileNotFoundError, match=f"^no committed experiment at {re.escape(url)}$"):
        ResultGrid.from_path(path)
    assert fs.ls(root, detail=False) == [f"{root}/experiment.json"]  # read only


# -- Checkpoint ------------------------------------------------------------------


@pytest.fixture
def ckpt_dir(tmp_path) -> str:
    d = tmp_path / "checkpoint_000003"
    (d / "sub").mkdir(parents=True)
    (d / "weights.bin").write_bytes(b"\x00\x01\x02")
    (d / "sub" / "meta.txt").write_text("m")
    return str(d)


def test_local_checkpoint_to_directory_and_as_directory(ckpt_dir, tmp_path):
    ckpt = Checkpoint.from_directory(ckpt_dir)
    assert ckpt.is_local
    copy = ckpt.to_directory()
    assert copy != ckpt_dir
    assert read_tree(copy) == read_tree(ckpt_dir)
    target = str(tmp_path / "given" / "place")
    assert ckpt.to_directory(target) == target
    assert read_tree(target) == read_tree(ckpt_dir)
    with ckpt.as_directory() as d:
        assert d == ckpt_dir  # local: no copy
        assert read_tree(d) == read_tree(ckpt_dir)


def test_from_directory_makes_the_path_absolute(ckpt_dir, monkeypatch):
    monkeypatch.chdir(os.path.dirname(ckpt_dir))
    ckpt = Checkpoint.from_directory("checkpoint_000003")
    assert ckpt.path == ckpt_dir
    assert ckpt == Checkpoint(ckpt_dir)
    assert hash(ckpt) == hash(Checkpoint(ckpt_dir))
    assert repr(ckpt) == f"Checkpoint({ckpt_dir!r})"


def test_file_url_checkpoint_is_local(ckpt_dir):
    ckpt = Checkpoint(f"file://{ckpt_dir}")
    assert ckpt.is_local
    assert ckpt.path == ckpt_dir
    assert read_tree(ckpt.to_directory()) == read_tree(ckpt_dir)
    with ckpt.as_directory() as d:
        assert read_tree(d) == read_tree(ckpt_dir)


def test_to_dict_reads_a_dict_checkpoint(tmp_path, ckpt_dir):
    d = tmp_path / "dict_ckpt"
    d.mkdir()
    (d / DICT_CHECKPOINT_FILE).write_bytes(pickle.dumps({"a": 1, "w": [1.5]}))
    assert Checkpoint.from_directory(d).to_dict() == {"a": 1, "w": [1.5]}
    with pytest.raises(ValueError, match=r"checkpoint .*checkpoint_000003 holds no dict"):
        Checkpoint.from_directory(ckpt_dir).to_dict()


def test_remote_checkpoint_is_copied_and_the_copy_cleaned_up():
    root = f"memory://ckpt-{uuid.uuid4().hex}/T_a/checkpoint_000001"
    fs, path = fsspec.core.url_to_fs(root)
    fs.pipe({f"{path}/{DICT_CHECKPOINT_FILE}": pickle.dumps({"x": 2}), f"{path}/sub/f": b"f"})
    try:
        ckpt = Checkpoint(root)
        assert not ckpt.is_local
        assert read_tree(ckpt.to_directory()) == {
            DICT_CHECKPOINT_FILE: pickle.dumps({"x": 2}),
            "sub/f": b"f",
        }
        with ckpt.as_directory() as d:
            assert os.path.exists(os.path.join(d, "sub", "f"))
        assert not os.path.exists(d)  # the temporary copy is gone
        assert ckpt.to_dict() == {"x": 2}
    finally:
        fs.rm(path.split("/T_a")[0], recursive=True)


# -- CheckpointConfig ------------------------------------------------------------


def test_checkpoint_config_defaults_are_rays():
    c = CheckpointConfig()
    assert (c.num_to_keep, c.checkpoint_score_attribute, c.checkpoint_score_order) == (
        None,
        None,
        "max",
    )
    assert (c.checkpoint_frequency, c.checkpoint_at_end) == (0, None)
    CheckpointConfig(num_to_keep=1, checkpoint_frequency=5, checkpoint_score_order="min")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_to_keep": 0}, r"`num_to_keep` is 0, but must be >= 1 or None"),
        ({"num_to_keep": -3}, r"`num_to_keep` is -3, but must be >= 1 or None"),
        ({"checkpoint_frequency": -1}, r"`checkpoint_frequency` is -1, but must be >= 0"),
        (
            {"checkpoint_score_order": "best"},
            r"`checkpoint_score_order` is 'best', but must be 'max' or 'min'",
        ),
    ],
)
def test_checkpoint_config_validation_messages(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CheckpointConfig(**kwargs)


def test_a_history_is_read_from_storage_when_first_used(tmp_path):
    """The driver keeps each trial's last result only; its history is its result.json,
    read on first use. A run's grid says so when the folder is gone; a grid read from an
    experiment still running (logs that may lag the commit) gives what is there."""
    from popflow.flows.experiment.results import results_of
    from popflow.flows.experiment.trial_table import TrialRecord
    from popflow.infra.storage.folder import Storage
    from popflow.schedulers import Trial

    storage = Storage(str(tmp_path))
    rec = TrialRecord(trial=Trial("t0", {"a": 1}), index=0, dirname="T_t0", num_results=2)
    rec.trial.last_result = {"score": 2}
    storage.append_text('{"score": 1}\n{"score": 2}\n{"score": 3}\n', "T_t0", "result.json")
    grid = results_of([rec], storage, "score", "max")
    assert list(grid[0].history) == [{"score": 1}, {"score": 2}]  # the committed ones
    assert list(grid[0].metrics_dataframe["score"]) == [1, 2]
    storage.remove("T_t0")
    with pytest.raises(FileNotFoundError, match="T_t0 is gone: a trial's history is read"):
        len(results_of([rec], storage, "score", "max")[0].history)
    assert list(results_of([rec], storage, "score", "max", logs_complete=False)[0].history) == []
