"""popflow: Population Based Training and early stopping on Prefect + Dask, with durable storage.

The public surface, with Ray Tune's names::

    from popflow import run, PopulationBasedTraining, Trainable, report, uniform
    results = run(MyTrainable, param_space={"lr": uniform(1e-4, 1e-1)},
                  scheduler=PopulationBasedTraining(...), num_samples=8,
                  metric="mean_accuracy", mode="max", storage="./results", seed=0)
    best = results.get_best_result()

The layers are importable on their own: ``popflow.schedulers`` (pure decision
logic), ``popflow.tasks`` (what runs on a worker), ``popflow.infra`` (storage,
the experiment log, the Dask cluster) and ``popflow.flows`` (the Prefect flow).
Importing popflow never imports Prefect: Dask workers import the user's script,
and with it popflow, but never use Prefect.
"""

from popflow.flows import CheckpointConfig, Result, ResultGrid, run
from popflow.flows.tuner import init
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
from popflow.tasks import Checkpoint, Trainable, get_checkpoint, report

__version__ = "0.1.0"

__all__ = [
    "PB2",
    "ASHAScheduler",
    "AsyncHyperBandScheduler",
    "Checkpoint",
    "CheckpointConfig",
    "FIFOScheduler",
    "HyperBandScheduler",
    "MedianStoppingRule",
    "PopulationBasedTraining",
    "PopulationBasedTrainingReplay",
    "Result",
    "ResultGrid",
    "Trainable",
    "TrialScheduler",
    "choice",
    "get_checkpoint",
    "grid_search",
    "init",
    "lograndint",
    "loguniform",
    "qloguniform",
    "qrandint",
    "quniform",
    "randint",
    "randn",
    "report",
    "run",
    "sample_from",
    "uniform",
]
