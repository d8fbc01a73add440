"""Pure decision logic and search spaces: numpy, scipy (PB2's GP) and the standard library."""

from popflow.schedulers.async_hyperband import ASHAScheduler, AsyncHyperBandScheduler
from popflow.schedulers.domains import Domain
from popflow.schedulers.hyperband import HyperBandScheduler, hyperband_plan
from popflow.schedulers.median_stopping import MedianStoppingRule
from popflow.schedulers.pb2 import PB2
from popflow.schedulers.pbt import PopulationBasedTraining, explore
from popflow.schedulers.pbt_replay import PopulationBasedTrainingReplay
from popflow.schedulers.search_space import (
    choice,
    grid_search,
    lograndint,
    loguniform,
    qlograndint,
    qloguniform,
    qrandint,
    qrandn,
    quniform,
    randint,
    randn,
    sample_from,
    uniform,
)
from popflow.schedulers.trial import Trial, TrialStatus
from popflow.schedulers.trial_scheduler import (
    Action,
    Decision,
    Exploit,
    FIFOScheduler,
    TrialScheduler,
)
from popflow.schedulers.variants import generate_variants

__all__ = [
    "PB2",
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
    "qlograndint",
    "qloguniform",
    "qrandint",
    "qrandn",
    "quniform",
    "randint",
    "randn",
    "sample_from",
    "uniform",
]
