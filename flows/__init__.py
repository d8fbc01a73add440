"""The driver: ``popflow.run``, its Prefect flow and round loop, results and the CLI.

Its names are imported on first use (PEP 562): ``popflow.run`` imports Dask's
client, which ``popflow status`` and ``popflow --help`` have no use for.
"""

from typing import TYPE_CHECKING

from popflow.infra.lazy_names import lazy_names

if TYPE_CHECKING:
    from popflow.flows.config import CheckpointConfig
    from popflow.flows.launch import run
    from popflow.flows.results import Result, ResultGrid

#: Each public name and the module it comes from.
_HOMES = {
    "CheckpointConfig": "popflow.flows.config",
    "Result": "popflow.flows.results",
    "ResultGrid": "popflow.flows.results",
    "run": "popflow.flows.launch",
}


__getattr__, __dir__ = lazy_names(__name__, _HOMES)

__all__ = ["CheckpointConfig", "Result", "ResultGrid", "run"]
