"""Adversary (issue 44, item 7 and the import surface): what a Ray user's callback reads
of a ``Trial`` (``from popflow.tune.experiment import Trial``), and what a trainable
reads of ``tune.get_context()``.

Checked on Ray 2.60 with the same script: in ``on_trial_complete`` a trial has
``checkpoint`` (its latest, or None), ``evaluated_params`` (the sampled values),
``custom_trial_name`` (None), ``error_file`` (None), ``placement_group_factory`` and
``is_finished()``; popflow's trial raises AttributeError on each. In a function trainable
Ray's context answers ``get_world_rank()``, ``get_world_size()``, ``get_local_rank()``
and ``get_node_rank()`` with None (Train-only); popflow's raises AttributeError.
"""

from __future__ import annotations

import os
import tempfile

import pytest

from popflow import train, tune
from popflow.tune.experiment import Trial

pytestmark = pytest.mark.integration


_TRIAL_NAMES = (
    "checkpoint",
    "evaluated_params",
    "custom_trial_name",
    "error_file",
    "placement_group_factory",
    "is_finished",
)
_CONTEXT_NAMES = ("get_world_rank", "get_world_size", "get_local_rank", "get_node_rank")


class _Reader(tune.Callback):
    def __init__(self) -> None:
        self.seen: dict[str, object] = {}

    def on_trial_complete(self, iteration, trials, trial, **info):
        assert isinstance(trial, Trial)
        for name in _TRIAL_NAMES:
            try:
                value = getattr(trial, name)
                self.seen[name] = value() if callable(value) else value
            except AttributeError as e:
                self.seen[name] = e


def _reports_a_checkpoint(config):
    context = tune.get_context()
    missing = [name for name in _CONTEXT_NAMES if not hasattr(context, name)]
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "w.txt"), "w") as f:
        f.write("w")
    train.report(
        {"s": config["x"], "context_lacks": ",".join(missing)},
        checkpoint=train.Checkpoint.from_directory(folder),
    )


def test_a_callback_and_a_trainable_read_what_ray_gives_them(initialised, tmp_path):
    reader = _Reader()
    results = tune.Tuner(
        _reports_a_checkpoint,
        param_space={"x": tune.choice([1, 2])},
        run_config=tune.RunConfig(
            name="surface", storage_path=str(tmp_path / "r"), verbose=0, callbacks=[reader]
        ),
    ).fit()
    assert results.errors == []
    failed = {k: v for k, v in reader.seen.items() if isinstance(v, AttributeError)}
    assert failed == {}
    assert reader.seen["evaluated_params"] == {"x": results[0].config["x"]}
    assert reader.seen["checkpoint"] is not None
    assert reader.seen["is_finished"] is True
    assert results[0].metrics["context_lacks"] == ""
