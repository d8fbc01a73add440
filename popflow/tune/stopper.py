"""``ray.tune.stopper``: stoppers that see every result on the driver."""

from popflow.schedulers.stoppers import (
    CombinedStopper,
    ExperimentPlateauStopper,
    FunctionStopper,
    MaximumIterationStopper,
    NoopStopper,
    Stopper,
    TimeoutStopper,
    TrialPlateauStopper,
)

__all__ = [
    "CombinedStopper",
    "ExperimentPlateauStopper",
    "FunctionStopper",
    "MaximumIterationStopper",
    "NoopStopper",
    "Stopper",
    "TimeoutStopper",
    "TrialPlateauStopper",
]
