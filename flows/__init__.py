"""Prefect flows: ``tune`` (the round loop) and what deployments point at."""

from popflow.flows.config import CheckpointConfig
from popflow.flows.launch import run
from popflow.flows.results import Result, ResultGrid

__all__ = ["CheckpointConfig", "Result", "ResultGrid", "run"]
