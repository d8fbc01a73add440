"""The driver: ``popflow.run``, its Prefect flow and round loop, results and the CLI.

Its names are imported on first use (PEP 562): ``popflow.run`` imports Dask's
client, which ``popflow status`` and ``popflow --help`` have no use for.
"""

from typing import TYPE_CHECKING

from popflow.flows.moved_modules import install as _install_old_names
from popflow.infra.lazy_names import lazy_names

if TYPE_CHECKING:
    from popflow.flows.api.launch import run
    from popflow.flows.api.simulate import Simulation, simulate
    from popflow.flows.experiment.results import Result, ResultGrid
    from popflow.flows.spec.config import CheckpointConfig

#: Each public name and the module it comes from.
_HOMES = {
    "CheckpointConfig": "popflow.flows.spec.config",
    "Result": "popflow.flows.experiment.results",
    "ResultGrid": "popflow.flows.experiment.results",
    "run": "popflow.flows.api.launch",
    "simulate": "popflow.flows.api.simulate",
    "Simulation": "popflow.flows.api.simulate",
}


_install_old_names()  # experiments and pickles from before the subpackages name old modules
__getattr__, __dir__ = lazy_names(__name__, _HOMES)

__all__ = ["CheckpointConfig", "Result", "ResultGrid", "Simulation", "run", "simulate"]
