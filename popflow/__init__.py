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
Importing popflow never imports Prefect, and the driver's names (``run``,
``ResultGrid``, ...) import the flows layer on first use: Dask workers import the
user's trainable, and with it popflow, but never drive a run.
"""

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from popflow.flows import CheckpointConfig, Result, ResultGrid, run
    from popflow.flows.tuner import init

__version__ = "0.1.0"

#: The driver's names, imported on first use: a Dask worker imports popflow (the worker
#: side and the user's trainable) but never the flows layer and its Dask client, which
#: cost each worker a fifth of a second at start (``popflow.flows`` imports no Prefect).
_DRIVER = {
    "CheckpointConfig": "popflow.flows",
    "Result": "popflow.flows",
    "ResultGrid": "popflow.flows",
    "run": "popflow.flows",
    "init": "popflow.flows.tuner",
}


def __getattr__(name: str) -> Any:
    module = _DRIVER.get(name)
    if module is None:
        raise AttributeError(f"module 'popflow' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this
    return value


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
