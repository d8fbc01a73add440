"""The tiny experiments schedules run: 2-4 trials of a few iterations each.

:func:`spec_for` builds the run's spec for a :class:`~popflow.flows.simulation.faults.Scenario`
over a given storage (a driver's fault storage): synchronous PBT, synchronous
HyperBand, ASHA, or FIFO with a searcher suggesting each trial. The trainable,
:class:`Accumulator`, is deterministic and keeps its state in its checkpoints, so a
run that resumes, falls back or clones from the wrong state shows it in its results.
"""

from __future__ import annotations

from typing import Any

from popflow.flows.simulation.faults import Scenario
from popflow.flows.spec.groups import StorageSpec
from popflow.flows.spec.ray_configs import FailureConfig, RunConfig, TuneConfig
from popflow.flows.spec.run_spec import RunSpec, run_spec
from popflow.infra.storage.folder import Storage
from popflow.schedulers import (
    AsyncHyperBandScheduler,
    FIFOScheduler,
    HyperBandScheduler,
    PopulationBasedTraining,
    TrialScheduler,
    uniform,
)
from popflow.schedulers.search import BasicVariantGenerator
from popflow.tasks.trainable import Trainable

#: The experiment's name in its storage
NAME = "sim"
#: Virtual seconds a lease lasts (each result takes one)
LEASE_TTL = 10.0


class Accumulator(Trainable):
    """``score`` adds ``config["a"]`` each step; the sum is its state (checkpointed)."""

    def setup(self, config: dict[str, Any]) -> None:
        self.total = 0.0

    def step(self) -> dict[str, Any]:
        self.total = round(self.total + float(self.config["a"]), 9)
        return {"score": self.total}

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {"total": self.total}

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.total = checkpoint["total"]


def scheduler_for(scenario: Scenario) -> TrialScheduler:
    metric = {"metric": "score", "mode": "max"}
    if scenario.kind == "pbt":
        return PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=2,
            hyperparam_mutations={"a": uniform(0.0, 10.0)},
            quantile_fraction=0.5,
            synch=True,
            **metric,
        )
    if scenario.kind == "hyperband":
        return HyperBandScheduler(max_t=scenario.iterations, reduction_factor=2, **metric)
    if scenario.kind == "asha":
        return AsyncHyperBandScheduler(
            max_t=scenario.iterations, grace_period=1, reduction_factor=2, **metric
        )
    return FIFOScheduler(**metric)


def spec_for(scenario: Scenario, storage: Storage, seed: int = 0) -> RunSpec:
    """The run ``scenario`` describes, in ``storage`` (experiment :data:`NAME`)."""
    searcher = scenario.kind == "searcher"
    return run_spec(
        Accumulator,
        {"a": uniform(0.0, 10.0)},
        TuneConfig(
            scheduler=scheduler_for(scenario),
            search_alg=BasicVariantGenerator() if searcher else None,
            num_samples=scenario.trials,
            seed=seed,
        ),
        RunConfig(
            name=NAME,
            failure_config=FailureConfig(max_failures=0),
            verbose=0,
            stop={"training_iteration": scenario.iterations},
        ),
        StorageSpec(storage, commit_interval=2.0, lease_ttl=LEASE_TTL),
    )
