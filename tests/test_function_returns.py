"""A function trainable's returned and yielded metrics are results, as in Ray (issue 44,
item 1): a returned dict is one more result after those reported, each yielded dict is a
result, a number is ``{"_metric": n}``, and anything else errors the trial, naming it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

import popflow
from popflow import tune
from popflow.infra.storage.folder import Storage
from popflow.tasks import Checkpoint, get_checkpoint, report
from popflow.tasks.live import discard_parked
from popflow.tasks.segment import run_segment
from popflow.tasks.specs import SegmentOutcome, SegmentSpec

TRIAL_DIR = "fn_t0"

# -- trainables ------------------------------------------------------------------


def reports_then_returns(config: dict[str, Any]) -> dict[str, Any]:
    for i in range(config.get("n", 2)):
        report({"step": i})
    return {"score": 7.0}


def only_returns(config: dict[str, Any]) -> dict[str, Any]:
    return {"score": config.get("x", 1.0) * 2}


def returns_a_number(config: dict[str, Any]) -> float:
    return 0.0  # Ray drops a 0 (it skips false values): popflow reports it


def returns_nothing(config: dict[str, Any]) -> None:
    report({"step": 0})


def returns_an_empty_dict(config: dict[str, Any]) -> dict[str, Any]:
    report({"step": 0})
    return {}


def returns_a_list(config: dict[str, Any]) -> list[float]:
    report({"step": 0})
    return [1.0]


def yields_a_string(config: dict[str, Any]) -> Iterator[Any]:
    yield {"step": 0}
    yield "done"


UNWOUND: list[int] = []  # the generator's finally block ran, at this step


def yields(config: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Yields ``{"step": i}``; from ``config["checkpoint_at"]`` on reports a checkpoint
    through report() once; resumes after it."""
    start = 0
    if (ckpt := get_checkpoint()) is not None:
        with ckpt.as_directory() as d, open(os.path.join(d, "step")) as f:
            start = int(f.read())
    i = start
    try:
        for i in range(start, config.get("n", 5)):
            if i == config.get("checkpoint_at"):
                with tempfile.TemporaryDirectory() as d:
                    with open(os.path.join(d, "step"), "w") as f:
                        f.write(str(i + 1))
                    report({"step": i, "resumed": start > 0}, checkpoint=Checkpoint(d))
            else:
                yield {"step": i, "resumed": start > 0}
    finally:
        UNWOUND.append(i)


# -- helpers ---------------------------------------------------------------------


@pytest.fixture
def storage(tmp_path) -> Storage:
    return Storage(str(tmp_path / "store"))


@pytest.fixture
def run() -> Iterator[Any]:
    """``run(spec)``: run_segment, then discard whatever the segment parked here."""
    tokens: list[str] = []

    def _run(spec: SegmentSpec) -> SegmentOutcome:
        outcome = run_segment(spec)
        if outcome.live_token:
            tokens.append(outcome.live_token)
        return outcome

    yield _run
    discard_parked(tokens)


def spec(storage: Storage, trainable: Any, **kwargs: Any) -> SegmentSpec:
    args: dict[str, Any] = {
        "trainable": trainable,
        "trial_id": "t0",
        "trial_dir": TRIAL_DIR,
        "config": {},
        "storage": storage,
        "seed": 0,
        "max_iterations": 100,
    }
    args.update(kwargs)
    return SegmentSpec(**args)


def ok(outcome: SegmentOutcome) -> SegmentOutcome:
    assert outcome.error is None, outcome.error
    return outcome


def metrics(outcome: SegmentOutcome, *keys: str) -> list[dict[str, Any]]:
    """Each result's ``training_iteration`` and ``keys`` (those it has)."""
    wanted = ("training_iteration", *keys)
    return [{k: r[k] for k in wanted if k in r} for r in outcome.results]


# -- returns ---------------------------------------------------------------------


@pytest.mark.unit
def test_a_returned_dict_is_one_more_result_after_the_reported_ones(storage, run):
    """Ray's session.report of the returned dict: its own iteration, not merged into the
    last reported result."""
    out = ok(run(spec(storage, reports_then_returns)))
    assert out.reason == "finished"
    assert metrics(out, "step", "score") == [
        {"training_iteration": 1, "step": 0},
        {"training_iteration": 2, "step": 1},
        {"training_iteration": 3, "score": 7.0},
    ]


@pytest.mark.unit
def test_a_function_that_only_returns_has_one_result(storage, run):
    out = ok(run(spec(storage, only_returns, config={"x": 2.0})))
    assert out.reason == "finished"
    assert metrics(out, "score") == [{"training_iteration": 1, "score": 4.0}]


@pytest.mark.unit
def test_a_returned_number_is_reported_as_metric(storage, run):
    out = ok(run(spec(storage, returns_a_number)))
    assert metrics(out, "_metric") == [{"training_iteration": 1, "_metric": 0.0}]


@pytest.mark.unit
@pytest.mark.parametrize("fn", [returns_nothing, returns_an_empty_dict])
def test_none_or_an_empty_dict_reports_nothing_more(storage, run, fn):
    out = ok(run(spec(storage, fn)))
    assert out.reason == "finished"
    assert metrics(out, "step") == [{"training_iteration": 1, "step": 0}]


@pytest.mark.unit
@pytest.mark.parametrize(
    "fn, what", [(returns_a_list, "returned [1.0] (list)"), (yields_a_string, "yielded 'done'")]
)
def test_anything_else_errors_the_trial_naming_it(storage, run, fn, what):
    out = run(spec(storage, fn))
    assert out.reason == "error"
    assert f"TypeError: trial t0: the function trainable {fn.__name__!r} {what}" in out.error
    assert len(out.results) == 1  # what it reported before stays


@pytest.mark.unit
def test_a_return_that_reaches_a_milestone_ends_the_segment_there(storage, run):
    """The returned dict is a result like any: at the scheduler's milestone the segment
    ends, and the next segment finds the function finished."""
    first = ok(run(spec(storage, reports_then_returns, time_attr="training_iteration", target=3)))
    assert first.reason == "milestone" and first.live_token
    assert first.results[-1]["score"] == 7.0
    second = ok(run(spec(storage, reports_then_returns, live_token=first.live_token)))
    assert second.reason == "finished" and second.results == []


# -- generators ------------------------------------------------------------------


@pytest.mark.unit
def test_each_yielded_dict_is_a_result(storage, run):
    out = ok(run(spec(storage, yields, config={"n": 3})))
    assert out.reason == "finished"
    assert metrics(out, "step") == [{"training_iteration": i + 1, "step": i} for i in range(3)]


@pytest.mark.unit
def test_a_generator_goes_on_live_across_segments(storage, run):
    first = ok(run(spec(storage, yields, time_attr="training_iteration", target=2)))
    assert first.reason == "milestone"
    second = ok(run(spec(storage, yields, live_token=first.live_token)))
    assert second.reason == "finished"
    assert [r["step"] for r in first.results + second.results] == [0, 1, 2, 3, 4]
    assert [r["training_iteration"] for r in second.results] == [3, 4, 5]


@pytest.mark.unit
def test_a_generator_unwound_at_a_segment_end_restarts_from_its_checkpoint(storage, run):
    """Ended where it cannot go on live (its trainable discarded: a pause, a clone), the
    generator is closed (its finally blocks run) and the next segment calls the function
    again, with get_checkpoint() the checkpoint it reported."""
    UNWOUND.clear()
    config = {"n": 5, "checkpoint_at": 2}
    first = ok(run(spec(storage, yields, config=config, max_iterations=3)))
    assert first.reason == "max_iterations" and len(first.checkpoints) == 1
    assert discard_parked([first.live_token]) == 1
    assert UNWOUND == [2]  # closed where it waited: in the report() of step 2
    restore = f"{TRIAL_DIR}/{first.checkpoints[-1].name}"
    second = ok(run(spec(storage, yields, config=config, restore=restore)))
    assert second.reason == "finished"
    assert metrics(second, "step", "resumed") == [
        {"training_iteration": 4, "step": 3, "resumed": True},
        {"training_iteration": 5, "step": 4, "resumed": True},
    ]


# -- through the Tuner -----------------------------------------------------------


def train_and_return(config: dict[str, Any]) -> dict[str, Any]:
    """Ray's user guide: "return a final set of metrics to Tune by returning them"."""
    score = 0.0
    for step in range(3):
        score += config["a"]
        report({"step": step})
    return {"score": score}


def train_and_yield(config: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for step in range(3):
        yield {"score": config["a"] * (step + 1)}


@pytest.mark.integration
@pytest.mark.parametrize("trainable", [train_and_return, train_and_yield])
def test_the_result_grid_holds_the_returned_or_yielded_metrics(
    prefect_server, dask_cluster, tmp_path, trainable
):
    popflow.init(dask_cluster)  # Ray scripts call ray.init() first; here: the test cluster
    tuner = tune.Tuner(
        trainable,
        param_space={"a": tune.grid_search([1.0, 2.0])},
        tune_config=tune.TuneConfig(metric="score", mode="max"),
        run_config=tune.RunConfig(name="returns", storage_path=str(tmp_path), verbose=0),
    )
    try:
        grid = tuner.fit()
    finally:
        popflow.init()
    assert not grid.errors
    assert sorted(r.metrics["score"] for r in grid) == [3.0, 6.0]
    iterations = 4 if trainable is train_and_return else 3  # a return is one more
    assert [r.metrics["training_iteration"] for r in grid] == [iterations] * 2
    assert grid.get_best_result().config == {"a": 2.0}
