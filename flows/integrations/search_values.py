"""What every search-algorithm adapter shares: whether a space holds search spaces, a
result's metric, and the values a model is told or suggests (numbers; numpy scalars as
JSON's). Nested keys as ``/``-joined names: :mod:`popflow.schedulers.search_space`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from popflow.schedulers import domains
from popflow.schedulers.search_space import flat_keys, is_grid_search


def has_domains(space: Mapping[str, Any]) -> bool:
    """``space`` holds popflow search spaces (domains or grid searches)."""
    return any(
        isinstance(v, domains.Domain) or is_grid_search(v) for v in flat_keys(dict(space)).values()
    )


def metric_of(result: dict[str, Any], metric: str | None) -> Any:
    """``result[metric]``; a ``/``-joined metric names a nested value, as in Ray."""
    if metric is None:
        return None
    if metric in result:
        return result[metric]
    node: Any = result
    for part in metric.split("/"):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def is_number(value: Any) -> bool:
    """A number a model can be told (not a bool)."""
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


def plain(value: Any) -> Any:
    """numpy scalars as Python ones, all through a config (configs are JSON)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(plain(v) for v in value)
    return value
