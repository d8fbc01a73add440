"""Run configuration objects, with Ray Tune's names and defaults."""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from popflow.schedulers.placement import PlacementGroupFactory
from popflow.schedulers.validation import check_int, is_real


@dataclass(frozen=True)
class CheckpointConfig:
    """How often trials checkpoint and how many checkpoints each keeps.

    - ``checkpoint_frequency``: save every N iterations (0: only where needed,
      i.e. where a scheduler pauses or clones the trial).
    - ``num_to_keep``: keep the best N by ``checkpoint_score_attribute``
      (the newest N if None); None keeps all. A checkpoint that any trial will
      restore from, or that an exploit chose, is never deleted.
    - ``checkpoint_at_end``: save when the trial ends (class API; default True
      there). Function trainables report their own checkpoints: as in Ray,
      ``checkpoint_at_end=True`` or a ``checkpoint_frequency`` raises for them.
    """

    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: str = "max"
    checkpoint_frequency: int = 0
    checkpoint_at_end: bool | None = None

    def __post_init__(self) -> None:
        # counts are ints: True, 2.5 or NaN as a frequency would never (or always) checkpoint
        check_int("num_to_keep", self.num_to_keep, low=1, optional=True)
        check_int("checkpoint_frequency", self.checkpoint_frequency, low=0)
        if self.checkpoint_score_attribute is not None and not isinstance(
            self.checkpoint_score_attribute, str
        ):
            raise TypeError(
                f"`checkpoint_score_attribute` is {self.checkpoint_score_attribute!r}, but must "
                "be a result key (a string) or None"
            )
        if self.checkpoint_score_order not in ("max", "min"):
            raise ValueError(
                f"`checkpoint_score_order` is {self.checkpoint_score_order!r}, but must be 'max' or 'min'"
            )
        if self.checkpoint_at_end is not None and not isinstance(self.checkpoint_at_end, bool):
            raise TypeError(
                f"`checkpoint_at_end` is {self.checkpoint_at_end!r}, but must be True, False or None"
            )


def check_resources(argument: str, resources: Any) -> None:
    """``resources`` as one trial holds them (``{"cpu": 2, "gpu": 0.5, "custom": 1}``): a
    dict of resource names to finite amounts >= 0; TypeError/ValueError naming
    ``argument`` and the entry otherwise (NaN or infinity would fit no worker, or all)."""
    if not isinstance(resources, Mapping):
        raise TypeError(
            f"`{argument}` is {resources!r}, but must be a dict such as "
            '{"cpu": 2, "gpu": 1} or None (a PlacementGroupFactory goes through '
            "tune.with_resources; per-config callables are Ray-only)"
        )
    for name, amount in resources.items():
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"`{argument}` has the key {name!r}, but its keys must be resource names "
                "(non-empty strings such as 'cpu' or 'gpu')"
            )
        if not is_real(amount):
            raise TypeError(f"`{argument}[{name!r}]` is {amount!r}, but must be a number >= 0")
        if not (amount >= 0 and math.isfinite(amount)):
            raise ValueError(
                f"`{argument}[{name!r}]` is {amount!r}, but must be a number >= 0"
                + ("" if amount < 0 else " and finite")
            )


#: Resources set by :func:`with_resources`, by trainable (the object itself is returned).
_RESOURCES: weakref.WeakKeyDictionary[Any, dict[str, float]] = weakref.WeakKeyDictionary()
#: The placement group factories given to :func:`with_resources`, by trainable.
_PLACEMENTS: weakref.WeakKeyDictionary[Any, PlacementGroupFactory] = weakref.WeakKeyDictionary()


def with_resources(trainable: Any, resources: Mapping[str, float] | PlacementGroupFactory) -> Any:
    """Ray's ``tune.with_resources``: every trial of ``trainable`` holds ``resources``
    (``{"cpu": 2, "gpu": 1}``, as ``resources_per_trial``, which wins if given too), or a
    :class:`~popflow.schedulers.placement.PlacementGroupFactory`, whose bundles sum to
    what a trial holds on one worker (a ``ResourceChangingScheduler`` starts every trial
    with it and may change it).

    Returns ``trainable`` itself, so the last call for a trainable counts.
    Ray's per-config callables are not supported.
    """
    if isinstance(resources, PlacementGroupFactory):
        _PLACEMENTS[trainable] = resources
        resources = resources.required_resources
    else:
        check_resources("resources", resources)
        _PLACEMENTS.pop(trainable, None)
    _RESOURCES[trainable] = dict(resources)
    return trainable


def resources_of(trainable: Any) -> dict[str, float] | None:
    """What :func:`with_resources` set for ``trainable`` (None: nothing)."""
    try:
        return _RESOURCES.get(trainable)
    except TypeError:  # not weak-referenceable: never registered
        return None


def placement_of(trainable: Any, resources: Mapping[str, float] | None) -> PlacementGroupFactory:
    """A trial's resources as Ray's ``get_trial_resources()`` gives them: the factory given
    to :func:`with_resources` where the run holds what it sums to, else one bundle of
    ``resources`` (the run's, in Dask's names; Ray's one CPU if none)."""
    try:
        given = _PLACEMENTS.get(trainable)
    except TypeError:
        given = None
    if given is not None and given.dask_resources() == (dict(resources) if resources else None):
        return given
    return PlacementGroupFactory.from_resources(resources)


def grows(scheduler: Any) -> bool:
    """Whether ``scheduler`` changes trials' resources as it goes (Ray's
    ``ResourceChangingScheduler``): the embedded cluster is cut for that."""
    from popflow.schedulers.resource_changing import ResourceChangingScheduler

    return isinstance(scheduler, ResourceChangingScheduler)


#: ``verbose`` as the console's log level (the Prefect UI gets its logs whatever it is)
VERBOSE_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.INFO, 3: logging.DEBUG}
DEFAULT_VERBOSE = 2


def check_verbose(verbose: int | bool | None) -> int:
    """``verbose`` as an int (None: the default), checked. ``False``/``True`` are 0 and 1, as
    Ray reads them (its examples pass ``RunConfig(verbose=False)``)."""
    if verbose is None:
        return DEFAULT_VERBOSE
    if not isinstance(verbose, int) or verbose not in VERBOSE_LEVELS:
        raise ValueError(f"`verbose` is {verbose!r}, but must be 0, 1, 2 or 3 (or False, True)")
    return int(verbose)
