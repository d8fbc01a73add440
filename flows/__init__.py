"""Prefect flows: ``tune`` (the round loop) and what deployments point at."""

from flows.config import CheckpointConfig
from flows.results import Result, ResultGrid
from flows.tune import tune

__all__ = ["CheckpointConfig", "Result", "ResultGrid", "tune"]
