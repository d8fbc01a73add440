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

Every public name is imported on first use (PEP 562): ``import popflow`` imports
no numpy, fsspec, Dask or Prefect, so the ``popflow`` command answers ``--help``
at once, and a Dask worker, which imports the user's trainable and with it
popflow, imports the worker side but never the driver's flows layer and its
Dask client (an import each worker would pay at its start).
"""

from typing import TYPE_CHECKING

from popflow.infra.lazy_names import lazy_names

if TYPE_CHECKING:
    from popflow.flows import CheckpointConfig, Result, ResultGrid, Simulation, run, simulate
    from popflow.flows.api.session import is_initialized, shutdown
    from popflow.flows.api.tuner import init
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
    from popflow.tasks import Checkpoint, Trainable, get_checkpoint, report
    from popflow.tasks.object_refs import ObjectRef, get, put

__version__ = "0.1.0"

_SCHEDULERS = (
    "PB2",
    "ASHAScheduler",
    "AsyncHyperBandScheduler",
    "FIFOScheduler",
    "HyperBandScheduler",
    "MedianStoppingRule",
    "PopulationBasedTraining",
    "PopulationBasedTrainingReplay",
    "TrialScheduler",
    "choice",
    "grid_search",
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
)
#: Each public name and the module it comes from.
_HOMES: dict[str, str] = {
    **dict.fromkeys(_SCHEDULERS, "popflow.schedulers"),
    **dict.fromkeys(("Checkpoint", "Trainable", "get_checkpoint", "report"), "popflow.tasks"),
    **dict.fromkeys(
        ("CheckpointConfig", "Result", "ResultGrid", "Simulation", "run", "simulate"),
        "popflow.flows",
    ),
    "init": "popflow.flows.api.tuner",
    **dict.fromkeys(("ObjectRef", "get", "put"), "popflow.tasks.object_refs"),
    **dict.fromkeys(("is_initialized", "shutdown"), "popflow.flows.api.session"),
}
#: The subpackages, as attributes too (``import popflow; popflow.schedulers``).
_SUBPACKAGES = ("air", "flows", "infra", "schedulers", "tasks", "tune")


__getattr__, __dir__ = lazy_names(__name__, _HOMES, _SUBPACKAGES)

__all__ = [
    "PB2",
    "ASHAScheduler",
    "AsyncHyperBandScheduler",
    "Checkpoint",
    "CheckpointConfig",
    "FIFOScheduler",
    "HyperBandScheduler",
    "MedianStoppingRule",
    "ObjectRef",
    "PopulationBasedTraining",
    "PopulationBasedTrainingReplay",
    "Result",
    "ResultGrid",
    "Simulation",
    "Trainable",
    "TrialScheduler",
    "choice",
    "get",
    "get_checkpoint",
    "grid_search",
    "init",
    "is_initialized",
    "lograndint",
    "loguniform",
    "put",
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
    "shutdown",
    "simulate",
    "uniform",
]
