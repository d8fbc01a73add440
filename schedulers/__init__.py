"""Pure decision logic and search spaces: numpy and the standard library only."""

from schedulers.async_hyperband import ASHAScheduler, AsyncHyperBandScheduler
from schedulers.hyperband import HyperBandScheduler, hyperband_plan
from schedulers.median_stopping import MedianStoppingRule
from schedulers.pbt import PopulationBasedTraining, explore
from schedulers.pbt_replay import PopulationBasedTrainingReplay
from schedulers.search_space import (
    Domain,
    choice,
    grid_search,
    lograndint,
    loguniform,
    qloguniform,
    qrandint,
    quniform,
    randint,
    randn,
    sample_from,
    uniform,
)
from schedulers.trial import Trial, TrialStatus
from schedulers.trial_scheduler import (
    Action,
    Decision,
    Exploit,
    FIFOScheduler,
    TrialScheduler,
)
from schedulers.variants import generate_variants

__all__ = [
    "ASHAScheduler",
    "Action",
    "AsyncHyperBandScheduler",
    "Decision",
    "Domain",
    "Exploit",
    "FIFOScheduler",
    "HyperBandScheduler",
    "MedianStoppingRule",
    "PopulationBasedTraining",
    "PopulationBasedTrainingReplay",
    "Trial",
    "TrialScheduler",
    "TrialStatus",
    "choice",
    "explore",
    "generate_variants",
    "grid_search",
    "hyperband_plan",
    "lograndint",
    "loguniform",
    "qloguniform",
    "qrandint",
    "quniform",
    "randint",
    "randn",
    "sample_from",
    "uniform",
]
