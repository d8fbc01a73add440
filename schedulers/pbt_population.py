"""PBT's book on its population: each trial's state at its latest perturbation point, the
ranking into quantiles, and the state's plain-data form for commits.

Shared by :class:`~popflow.schedulers.pbt.PopulationBasedTraining` and PB2, pure data
and pure functions (no randomness here).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["TrialState", "quantiles", "states_from_rows", "states_to_rows"]


@dataclass
class TrialState:
    """Per-trial PBT bookkeeping (Ray's ``_PBTTrialState``), plain data.

    ``last_score``/``last_train_time``/``last_result`` are taken at perturbation
    points only, as in Ray, so a trial is ranked on the result its latest
    checkpoint belongs to. ``config`` is the config that checkpoint trained with.
    """

    orig_tag: str
    config: dict[str, Any]
    live: bool = True
    last_score: float | None = None
    last_perturbation_time: float = 0
    last_train_time: float = 0
    last_result: dict[str, Any] | None = None
    #: it ranked in the top quantile at its latest perturbation point: Ray keeps that
    #: checkpoint to clone (any other is not cloned)
    clonable: bool = False


def quantiles(
    scores: Sequence[tuple[str, float]], quantile_fraction: float
) -> tuple[list[str], list[str]]:
    """Bottom and top ``quantile_fraction`` of trial ids by ascending score (Ray's ``_quantiles``).

    Both hold ``min(ceil(n * q), floor(n / 2))`` ids, so they never overlap;
    fewer than two scored trials give no quantiles. Ties keep input order.
    """
    ranked = [tid for tid, _ in sorted(scores, key=lambda item: item[1])]
    if len(ranked) < 2:
        return [], []
    num = math.ceil(len(ranked) * quantile_fraction)
    if num > len(ranked) / 2:
        num = math.floor(len(ranked) / 2)
    if num == 0:  # Ray's ranked[-0:] would make everyone "top"
        return [], []
    return ranked[:num], ranked[-num:]


def states_to_rows(states: Mapping[str, TrialState]) -> list[dict[str, Any]]:
    """The states as JSON-able rows, in add order (ties rank by it)."""
    return [{"trial_id": tid, **asdict(s)} for tid, s in states.items()]  # asdict copies


def states_from_rows(rows: Iterable[Mapping[str, Any]]) -> dict[str, TrialState]:
    """The states :func:`states_to_rows` wrote (the rows are not changed)."""
    states = {}
    for row in rows:
        entry = copy.deepcopy(dict(row))
        trial_id = entry.pop("trial_id")
        states[trial_id] = TrialState(**entry)
    return states
