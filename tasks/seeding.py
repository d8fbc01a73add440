"""Per-segment seeds: one experiment seed drives every worker's global RNGs."""

from __future__ import annotations

import random
import sys
from typing import NamedTuple

import numpy as np

#: ``trial_index`` used for the driver's own stream (scheduler decisions), apart from any trial.
DRIVER = -1


class ExperimentGenerators(NamedTuple):
    variants: np.random.Generator  # trial sampling
    scheduler: np.random.Generator  # the scheduler's decisions (explore, tie-breaks, brackets)


def experiment_generators(seed: int) -> ExperimentGenerators:
    """The generators the experiment seed gives the driver (the same on every resume)."""
    variants, scheduler = np.random.SeedSequence(seed).spawn(2)
    return ExperimentGenerators(np.random.default_rng(variants), np.random.default_rng(scheduler))


def searcher_seed(experiment_seed: int) -> int:
    """The seed a run's search algorithm gets when it has none of its own."""
    seq = np.random.SeedSequence([experiment_seed, 0x5EA2C4])
    return int(seq.generate_state(1, dtype=np.uint32)[0])


def segment_seed(experiment_seed: int, trial_index: int, step: int, generation: int = 0) -> int:
    """A 32-bit seed for one trial's segment starting at iteration ``step``
    (or, with ``trial_index=DRIVER``, for the driver's ``step``-th decision).

    ``generation`` counts the trial's clones: a trial sent back by PBT to an
    iteration it already trained from must not replay the same noise.
    """
    seq = np.random.SeedSequence([experiment_seed, trial_index + 1, step, generation])
    return int(seq.generate_state(1, dtype=np.uint32)[0])


def seed_globals(seed: int) -> None:
    """Seed Python's ``random`` and numpy's global RNG (and torch's, if loaded)."""
    random.seed(seed)
    np.random.seed(seed)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)
