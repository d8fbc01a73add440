"""What the framework callbacks' tests (Lightning, Keras) share: a grid of learning rates
through the real driver on the simulated backend, and the two scheduler cases every
callback must survive (a PBT clone resuming the donor's training, ASHA unwinding it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import popflow
from popflow import ASHAScheduler, PopulationBasedTraining


def simulate_lrs(
    tmp_path: Any, trainable: Callable[..., Any], lrs: list[float], **kwargs: Any
) -> popflow.Simulation:
    """``trainable`` over a grid of ``lr``, minimising ``kwargs["metric"]`` (``loss``)."""
    return popflow.simulate(
        trainable,
        {"lr": popflow.grid_search(lrs)},
        metric=kwargs.pop("metric", "loss"),
        mode="min",
        storage=str(tmp_path),
        **kwargs,
    )


def clone_at_2(tmp_path: Any, trainable: Callable[..., Any]) -> tuple[list, list]:
    """Synchronous PBT clones the better of two trials (lr 0.5) into the worse (lr 0.001)
    at iteration 2, with the donor's lr; the (donor, clone) histories."""
    pbt = PopulationBasedTraining(
        perturbation_interval=2,
        hyperparam_mutations={"lr": [0.5]},
        quantile_fraction=0.5,
        resample_probability=1.0,  # the clone trains with the donor's lr
        synch=True,
    )
    sim = simulate_lrs(tmp_path, trainable, [0.5, 0.001], scheduler=pbt)
    donor, clone = sorted(sim.grid, key=lambda r: r.metrics["loss"])
    return list(donor.history), list(clone.history)


def asha_spent(tmp_path: Any, trainable: Callable[..., Any], max_t: int) -> list[int]:
    """ASHA over four learning rates, one fast: the iterations each trial ran, sorted;
    fails if any trial errored (a stop must unwind the framework's loop cleanly)."""
    sim = simulate_lrs(
        tmp_path,
        trainable,
        [0.5, 0.001, 0.0005, 0.0001],
        scheduler=ASHAScheduler(max_t=max_t, grace_period=1, reduction_factor=4),
    )
    assert sim.grid.num_errors == 0, sim.grid.errors
    return sorted(len(list(r.history)) for r in sim.grid)
