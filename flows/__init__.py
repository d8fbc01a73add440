"""The driver: ``popflow.run``, its Prefect flow and round loop, results and the CLI."""

from popflow.flows.config import CheckpointConfig
from popflow.flows.launch import run
from popflow.flows.results import Result, ResultGrid

__all__ = ["CheckpointConfig", "Result", "ResultGrid", "run"]
