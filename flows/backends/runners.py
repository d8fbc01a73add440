"""A runner actor as the driver holds it, and what a call to one that returned nothing says
(:mod:`popflow.flows.backends.dask_pool` makes and calls them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from distributed import Future


@dataclass
class CallFailed:
    """A call that returned no outcomes: its segments must run again.

    ``worker_lost``: the worker's connection closed under it (the worker died).
    Otherwise the call itself failed there (e.g. its arguments could not be
    unpickled on the worker).
    """

    message: str
    worker_lost: bool
    #: the worker could not unpickle the call's segments: the trial's code (or an object
    #: its config or stop condition refers to) is not loadable there
    code_missing: bool = False
    #: (worker lost) the call was running when its worker died, not waiting behind another
    running: bool = False
    #: (worker lost) the call ran alone on its worker (``exclusive``): it took it down
    alone: bool = False


@dataclass
class Runner:
    worker: str
    actor: Any  # distributed.Actor
    future: Future  # the actor lives as long as this future is held
    hold: Future  # its slot: the hold_slot task its segments run in
    queued: int = 0
    #: what its slot holds (Dask's names; None: nothing named)
    resources: Mapping[str, float] | None = None


def pick_runner(runners: list[Runner], worker: str | None, idle_first: bool) -> Runner:
    """The least busy runner on ``worker`` (where the call's trainables are parked) if
    it has one, else the least busy anywhere. ``idle_first``: a free runner, on
    ``worker`` if it has one free, before any busy one (a parked trainable is cheaper
    to restore elsewhere than a slot is to leave idle)."""
    on_worker = [r for r in runners if r.worker == worker]
    if idle_first:
        idle = [r for r in on_worker if not r.queued] or [r for r in runners if not r.queued]
        if idle:
            return idle[0]
    return min(on_worker or runners, key=lambda r: r.queued)
