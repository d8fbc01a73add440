"""``ray.tune.schedulers``: every scheduler under Ray's names."""

from popflow.schedulers import (
    PB2,
    ASHAScheduler,
    AsyncHyperBandScheduler,
    FIFOScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    PopulationBasedTraining,
    PopulationBasedTrainingReplay,
    TrialScheduler,
)
from popflow.schedulers.hb_bohb import HyperBandForBOHB
from popflow.schedulers.resource_changing import (
    DistributeResources,
    DistributeResourcesToTopJob,
    ResourceChangingScheduler,
)

__all__ = [
    "PB2",
    "ASHAScheduler",
    "AsyncHyperBandScheduler",
    "DistributeResources",
    "DistributeResourcesToTopJob",
    "FIFOScheduler",
    "HyperBandForBOHB",
    "HyperBandScheduler",
    "MedianStoppingRule",
    "PopulationBasedTraining",
    "PopulationBasedTrainingReplay",
    "ResourceChangingScheduler",
    "TrialScheduler",
]
