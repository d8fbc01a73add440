"""Run configuration objects, with Ray Tune's names and defaults."""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


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
        if self.num_to_keep is not None and self.num_to_keep < 1:
            raise ValueError(f"`num_to_keep` is {self.num_to_keep}, but must be >= 1 or None")
        if self.checkpoint_frequency < 0:
            raise ValueError(
                f"`checkpoint_frequency` is {self.checkpoint_frequency}, but must be >= 0"
            )
        if self.checkpoint_score_order not in ("max", "min"):
            raise ValueError(
                f"`checkpoint_score_order` is {self.checkpoint_score_order!r}, but must be 'max' or 'min'"
            )


#: Resources set by :func:`with_resources`, by trainable (the object itself is returned).
_RESOURCES: weakref.WeakKeyDictionary[Any, dict[str, float]] = weakref.WeakKeyDictionary()


def with_resources(trainable: Any, resources: Mapping[str, float]) -> Any:
    """Ray's ``tune.with_resources``: every trial of ``trainable`` holds ``resources``
    (``{"cpu": 2, "gpu": 1}``, as ``resources_per_trial``, which wins if given too).

    Returns ``trainable`` itself, so the last call for a trainable counts.
    Ray's placement groups and per-config callables are not supported.
    """
    if not isinstance(resources, Mapping):
        raise TypeError(
            f"`resources` must be a dict such as {{'cpu': 2, 'gpu': 1}}, got {resources!r} "
            "(placement groups and callables are Ray-only)"
        )
    _RESOURCES[trainable] = dict(resources)
    return trainable


def resources_of(trainable: Any) -> dict[str, float] | None:
    """What :func:`with_resources` set for ``trainable`` (None: nothing)."""
    try:
        return _RESOURCES.get(trainable)
    except TypeError:  # not weak-referenceable: never registered
        return None
