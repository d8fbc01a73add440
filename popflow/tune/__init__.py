"""Ray Tune's namespace: ``from popflow import tune`` where a script had ``from ray import tune``.

    tuner = tune.Tuner(Trainable, param_space={"lr": tune.loguniform(1e-4, 1e-1)},
                       tune_config=tune.TuneConfig(metric="loss", mode="min",
                                                   scheduler=ASHAScheduler()),
                       run_config=tune.RunConfig(name="exp", stop={"training_iteration": 10}))
    results = tuner.fit()

What Ray accepts and popflow cannot honour yet raises at once, naming the
argument (:class:`popflow.flows.api.tuner.Unsupported`).
"""

from popflow.flows.api.training import TrialError
from popflow.flows.api.tune_run import TuneError
from popflow.flows.api.tune_run import tune_run as run
from popflow.flows.api.tuner import FailureConfig, RunConfig, TuneConfig, Tuner, Unsupported
from popflow.flows.events.callbacks import Callback
from popflow.flows.experiment.results import Result, ResultGrid, TrialFailure
from popflow.flows.spec.config import CheckpointConfig, with_resources
from popflow.schedulers import (
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
from popflow.schedulers.placement import PlacementGroupFactory
from popflow.schedulers.stoppers import Stopper
from popflow.tasks import Checkpoint, Trainable, get_checkpoint, report
from popflow.tasks.parameters import with_parameters
from popflow.tasks.trial_context import TuneContext, get_context
from popflow.tune import logger, schedulers, search, stopper

__all__ = [
    "Callback",
    "Checkpoint",
    "CheckpointConfig",
    "FailureConfig",
    "PlacementGroupFactory",
    "Result",
    "ResultGrid",
    "RunConfig",
    "Stopper",
    "Trainable",
    "TrialError",
    "TrialFailure",
    "TuneConfig",
    "TuneContext",
    "TuneError",
    "Tuner",
    "Unsupported",
    "choice",
    "get_checkpoint",
    "get_context",
    "grid_search",
    "logger",
    "lograndint",
    "loguniform",
    "qlograndint",
    "qloguniform",
    "qrandint",
    "qrandn",
    "quniform",
    "randint",
    "randn",
    "report",
    "run",
    "sample_from",
    "schedulers",
    "search",
    "stopper",
    "uniform",
    "with_parameters",
    "with_resources",
]
