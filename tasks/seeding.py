"""Per-segment seeds: one experiment seed drives every worker's global RNGs."""

from __future__ import annotations

import random
import sys

import numpy as np


def segment_seed(experiment_seed: int, trial_index: int, start_iteration: int) -> int:
    """A 32-bit seed for one trial's segment, independent of worker and timing."""
    seq = np.random.SeedSequence([experiment_seed, trial_index, start_iteration])
    return int(seq.generate_state(1, dtype=np.uint32)[0])


def seed_globals(seed: int) -> None:
    """Seed Python's ``random`` and numpy's global RNG (and torch's, if loaded)."""
    random.seed(seed)
    np.random.seed(seed)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)
