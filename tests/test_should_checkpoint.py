"""Ray's ``SHOULD_CHECKPOINT`` (``popflow.tune.result``): a result with it set, by the
trainable or by a driver-side callback, makes the trial save a checkpoint of that
result's state; nothing else saves where the user asked for no checkpoints."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import pytest

import popflow
from popflow import tune
from popflow.tune.result import SHOULD_CHECKPOINT

pytestmark = pytest.mark.unit

NONE_ASKED = tune.CheckpointConfig(checkpoint_frequency=0, checkpoint_at_end=False)


class Steps(tune.Trainable):
    """Counts its steps; a checkpoint holds the count it was saved at. ``ask_at``: the
    iterations whose result asks for a checkpoint itself."""

    def setup(self, config: dict[str, Any]) -> None:
        self.n = 0

    def step(self) -> dict[str, Any]:
        self.n += 1
        return {"score": float(self.n), SHOULD_CHECKPOINT: self.n in self.config["ask_at"]}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "n.json"), "w") as f:
            json.dump(self.n, f)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "n.json")) as f:
            self.n = json.load(f)


class AskAt(tune.Callback):
    """Asks for a checkpoint at the given iterations, as Ray's example callback does."""

    def __init__(self, *iterations: int) -> None:
        self.iterations = set(iterations)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result["training_iteration"] in self.iterations:
            result[SHOULD_CHECKPOINT] = True


def saved(tmp_path, callbacks=(), ask_at=(), **kwargs: Any) -> list[tuple[int, int]]:
    """(iteration, the count its checkpoint holds) of each checkpoint the trial kept."""
    sim = popflow.simulate(
        Steps,
        {"ask_at": list(ask_at)},
        metric="score",
        mode="max",
        stop={"training_iteration": 6},
        checkpoint_config=kwargs.pop("checkpoint_config", NONE_ASKED),
        callbacks=list(callbacks),
        storage=str(tmp_path),
        **kwargs,
    )
    (result,) = list(sim.grid)
    out = []
    for checkpoint, metrics in result.best_checkpoints:
        with checkpoint.as_directory() as d, open(os.path.join(d, "n.json")) as f:
            out.append((metrics["training_iteration"], json.load(f)))
    return sorted(out)


def test_a_callback_gets_a_checkpoint_of_the_result_it_marks_and_nothing_else(tmp_path):
    assert saved(tmp_path / "a", [AskAt(2, 5)]) == [(2, 2), (5, 5)]
    assert saved(tmp_path / "b", [AskAt()]) == []  # seeing each result saves nothing


def test_a_trainable_that_marks_its_own_result_is_saved_there(tmp_path):
    assert saved(tmp_path, ask_at=[3]) == [(3, 3)]


def test_a_marked_result_with_a_checkpoint_already_is_not_saved_twice(tmp_path):
    every_two = tune.CheckpointConfig(checkpoint_frequency=2, checkpoint_at_end=False)
    got = saved(tmp_path, [AskAt(2, 3)], checkpoint_config=every_two)
    assert got == [(2, 2), (3, 3), (4, 4), (6, 6)]


def test_a_mark_on_the_last_result_is_named_when_the_state_is_gone(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        assert saved(tmp_path, [AskAt(6)]) == []
    assert "ended at the result a callback asked to checkpoint" in caplog.text


def test_under_a_milestone_scheduler_a_mark_gets_the_milestones_checkpoint(tmp_path):
    """Where ASHA's milestones bound the segments the driver sees results there: a mark
    on an earlier result is served by the checkpoint the milestone saves (unlike Ray)."""
    asha = popflow.ASHAScheduler(max_t=6, grace_period=2, reduction_factor=2)
    got = saved(tmp_path, [AskAt(1)], scheduler=asha)
    assert (1, 1) not in got and (2, 2) in got
