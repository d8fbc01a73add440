"""A class trainable with only ``setup``/``step`` (no ``save_checkpoint``) runs wherever the
run never needs its state saved, as in Ray: FIFO, ASHA (it stops, never pauses) and the
median stopping rule with its hard stops. Where a checkpoint is needed (PBT's clones,
HyperBand's pauses, a soft stop, ``checkpoint_frequency``, ``checkpoint_at_end=True``)
the run is refused before anything is written, naming why, not each trial errored
after it trained (issue 46, break 10)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import popflow
from popflow import (
    ASHAScheduler,
    CheckpointConfig,
    HyperBandScheduler,
    MedianStoppingRule,
    PopulationBasedTraining,
    PopulationBasedTrainingReplay,
    Trainable,
    report,
    run,
    uniform,
)

SETUPS: list[str] = []


class Plain(Trainable):
    """setup and step only: its state (``x``) lives in the object."""

    def setup(self, config: dict[str, Any]) -> None:
        SETUPS.append(self.trial_id)
        self.x = config["x"]

    def step(self) -> dict[str, Any]:
        self.x *= 0.5
        return {"loss": self.x}


def never_checkpoints(config: dict[str, Any]) -> None:
    x = config["x"]
    for _ in range(4):
        x *= 0.5
        report({"loss": x})


def simulate(tmp_path, trainable: Any, **kwargs: Any) -> popflow.Simulation:
    SETUPS.clear()
    return popflow.simulate(
        trainable,
        {"x": uniform(1.0, 2.0)},
        metric="loss",
        mode="min",
        stop={"training_iteration": 4},
        storage=str(tmp_path),
        name="plain",
        **{"num_samples": 4, "slots": 2, **kwargs},
    )


def assert_trained_from_their_own_state(sim: popflow.Simulation) -> None:
    """Every trial ended without error, each of its results halving its own ``x``
    (a trainable rebuilt from scratch halfway would start over at ``x``)."""
    for result in sim.grid:
        assert result.status == "TERMINATED" and not result.error, result.error
        x = result.config["x"]
        got = [(r["training_iteration"], r["loss"]) for r in result.history]
        assert got == [(i, x * 0.5**i) for i in range(1, len(got) + 1)]


@pytest.mark.unit
def test_a_plain_class_runs_under_fifo_without_a_checkpoint(tmp_path):
    sim = simulate(tmp_path, Plain)
    assert_trained_from_their_own_state(sim)
    assert [len(r.history) for r in sim.grid] == [4, 4, 4, 4]
    assert all(r.checkpoint is None for r in sim.grid)
    assert sorted(SETUPS) == sorted(set(SETUPS))  # one object per trial
    assert not list(tmp_path.glob("plain/*/checkpoint_*"))


@pytest.mark.unit
def test_a_function_that_never_checkpoints_runs_under_fifo(tmp_path):
    sim = simulate(tmp_path, never_checkpoints)
    assert_trained_from_their_own_state(sim)
    assert [len(r.history) for r in sim.grid] == [4, 4, 4, 4]


@pytest.mark.unit
@pytest.mark.parametrize(
    "scheduler",
    [
        lambda: ASHAScheduler(max_t=4, grace_period=1, reduction_factor=2),
        # with fewer samples than it needs, a trial yields (PAUSE) to waiting ones: an
        # unsaved trainable is kept live for it, not rebuilt from scratch
        lambda: MedianStoppingRule("training_iteration", grace_period=1, min_samples_required=3),
    ],
    ids=["asha", "median"],
)
def test_a_plain_class_runs_under_schedulers_that_only_stop(tmp_path, scheduler):
    sim = simulate(tmp_path, Plain, scheduler=scheduler(), num_samples=6)
    assert_trained_from_their_own_state(sim)
    assert len(SETUPS) == 6  # one object per trial: no trial trained again from scratch
    assert any(len(r.history) < 4 for r in sim.grid)  # the scheduler did stop some


def policy(tmp_path) -> str:
    path = tmp_path / "pbt_policy_t1.txt"
    path.write_text(json.dumps(["1", "0", 3, 2, {"x": 1.0}, {"x": 1.5}]) + "\n")
    return str(path)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("arguments", "why"),
    [
        (
            lambda tmp: {
                "scheduler": PopulationBasedTraining(
                    "training_iteration",
                    perturbation_interval=2,
                    hyperparam_mutations={"x": uniform(1.0, 2.0)},
                )
            },
            "the scheduler PopulationBasedTraining pauses or clones trials",
        ),
        (
            lambda tmp: {"scheduler": HyperBandScheduler(max_t=4)},
            "the scheduler HyperBandScheduler pauses or clones trials",
        ),
        (
            lambda tmp: {"scheduler": MedianStoppingRule(hard_stop=False)},
            "the scheduler MedianStoppingRule pauses or clones trials",
        ),
        (
            lambda tmp: {"scheduler": PopulationBasedTrainingReplay(policy(tmp))},
            "the scheduler PopulationBasedTrainingReplay pauses or clones trials",
        ),
        (
            lambda tmp: {"checkpoint_config": CheckpointConfig(checkpoint_frequency=2)},
            r"`checkpoint_frequency=2` asks for a checkpoint every 2 iterations",
        ),
        (
            lambda tmp: {"checkpoint_config": CheckpointConfig(checkpoint_at_end=True)},
            r"`checkpoint_at_end=True` asks for a checkpoint at each trial's end",
        ),
    ],
    ids=["pbt", "hyperband", "median-soft-stop", "pbt-replay", "frequency", "at-end"],
)
def test_what_needs_a_checkpoint_is_refused_before_anything_is_written(tmp_path, arguments, why):
    storage = tmp_path / "results"
    with pytest.raises(
        ValueError, match=rf"`trainable` Plain does not implement save_checkpoint\(\), but {why}"
    ):
        popflow.simulate(
            Plain,
            {"x": 1.0},
            metric="loss",
            mode="min",
            storage=str(storage),
            stop={"training_iteration": 2},
            **arguments(tmp_path),
        )
    assert not storage.exists() or not any(storage.iterdir())


@pytest.mark.unit
def test_a_class_that_saves_still_checkpoints_at_its_end(tmp_path):
    saving = type("Saving", (Plain,), {"save_checkpoint": lambda self, d: {"x": self.x}})
    sim = simulate(tmp_path, saving, num_samples=1)
    (result,) = list(sim.grid)
    assert result.checkpoint is not None and result.checkpoint.to_dict() == {
        "x": result.config["x"] / 16
    }


@pytest.mark.integration
def test_a_plain_class_runs_on_a_dask_cluster(tune_env):
    results = run(
        Plain,
        {"x": uniform(1.0, 2.0)},
        metric="loss",
        mode="min",
        num_samples=2,
        stop={"training_iteration": 3},
        name="plain",
        **tune_env,
    )
    assert [(r.status, r.error) for r in results] == [("TERMINATED", None)] * 2
    for result in results:
        x = result.config["x"]
        assert [r["loss"] for r in result.history] == [x / 2, x / 4, x / 8]
