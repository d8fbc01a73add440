"""Ray's ``BasicVariantGenerator``: random and grid search over ``param_space``, the
``points_to_evaluate`` first (what popflow does without a ``search_alg``)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np

from popflow.schedulers.search.searcher import FINISHED, Searcher
from popflow.schedulers.variants import Variant, count_variants, resolve_variants


class BasicVariantGenerator(Searcher):
    """Variants of ``param_space``, as many as ``num_samples`` times its grid; the first
    samples take their values from ``points_to_evaluate`` (partial configs: what a point
    leaves out is sampled). ``max_concurrent`` > 0 caps the trials live at once;
    ``random_state`` (an int or a numpy ``Generator``) seeds the sampling, else the run's
    seed does. ``constant_grid_search`` is accepted for Ray's sake: popflow samples each
    grid point's other values anew, as Ray does by default."""

    # the generator bounds itself: num_samples times the grid, not num_samples
    bounded_by_num_samples = False

    def __init__(
        self,
        points_to_evaluate: list[dict[str, Any]] | None = None,
        max_concurrent: int = 0,
        constant_grid_search: bool = False,
        random_state: int | np.random.Generator | None = None,
    ) -> None:
        super().__init__()
        if points_to_evaluate is not None and (
            not isinstance(points_to_evaluate, list)
            or not all(isinstance(p, Mapping) for p in points_to_evaluate)
        ):
            raise TypeError(
                f"`points_to_evaluate` is {points_to_evaluate!r}, but must be a list of dicts"
            )
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int):
            raise TypeError(f"`max_concurrent` is {max_concurrent!r}, but must be an int >= 0")
        self.points_to_evaluate = [dict(p) for p in points_to_evaluate or []]
        self.max_concurrent = max_concurrent
        self.constant_grid_search = constant_grid_search
        self._random_state = random_state
        self._space: dict[str, Any] = {}
        self._num_samples = 1
        self._seed: int | None = None
        self._sampler: np.random.Generator | None = None  # made at the first suggestion
        self._sample = 0  # samples (each a pass over the grid) begun
        self._pending: list[Variant] = []  # the grid of the current sample, not yet suggested
        self._made = 0
        self._tags: dict[str, str] = {}
        self._live: set[str] = set()

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        self._space = dict(config)
        self._num_samples = int(spec.get("num_samples", 1))
        self._seed = spec.get("seed")
        return True

    def _rng(self) -> np.random.Generator:
        if isinstance(self._random_state, np.random.Generator):
            return self._random_state
        seed = self._random_state if self._random_state is not None else self._seed
        return np.random.default_rng(seed)

    def _next_variant(self) -> Variant | None:
        """The next variant, made when it is asked for (None: all were made): a
        ``num_samples`` of a billion costs nothing up front, and the variants come in the
        order, and with the values, of sampling them all at once."""
        while not self._pending:
            if self._sample >= self._num_samples:
                return None
            if self._sampler is None:
                self._sampler = self._rng()
            space = self._space
            if self._sample < len(self.points_to_evaluate):
                space = with_point(space, self.points_to_evaluate[self._sample])
            self._pending = resolve_variants(space, 1, self._sampler)
            self._sample += 1
        v = self._pending.pop(0)
        self._made += 1
        return Variant(self._made - 1, v.config, v.resolved_vars)

    def total(self) -> int:
        """How many trials this generator makes (counted, not made)."""
        points = self.points_to_evaluate[: self._num_samples]
        rest = self._num_samples - len(points)
        return sum(count_variants(with_point(self._space, p), 1) for p in points) + (
            rest * count_variants(self._space, 1) if rest else 0
        )

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        more = bool(self._pending) or self._sample < self._num_samples
        if more and self.max_concurrent and len(self._live) >= self.max_concurrent:
            return None
        variant = self._next_variant()
        if variant is None:
            return FINISHED
        self._tags[trial_id] = variant.tag
        self._live.add(trial_id)
        return variant.config

    def tag(self, trial_id: str) -> str | None:
        """Ray's ``experiment_tag`` of a trial this generator suggested."""
        return self._tags.get(trial_id)

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        self._live.discard(trial_id)


def with_point(space: Mapping[str, Any], point: Mapping[str, Any]) -> dict[str, Any]:
    """``space`` with the values of ``point`` (nested dicts, or keys joined by '/') in
    place of what it would sample there."""
    out = copy.deepcopy(dict(space))
    for key, value in point.items():
        path = key.split("/") if isinstance(key, str) and "/" in key else [key]
        _set(out, path, value)
    return out


def _set(tree: dict[str, Any], path: list[Any], value: Any) -> None:
    head, rest = path[0], path[1:]
    if rest:
        child = tree.get(head)
        if not isinstance(child, dict):
            child = tree[head] = {}
        _set(child, rest, value)
    elif isinstance(value, Mapping) and isinstance(tree.get(head), dict):
        for k, v in value.items():
            _set(tree[head], [k], v)
    else:
        tree[head] = copy.deepcopy(value)
