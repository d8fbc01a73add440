"""Trial configs from a ``param_space``: Ray's ``BasicVariantGenerator`` as pure functions.

Every ``grid_search`` axis anywhere in the (nested) ``param_space`` is crossed
with every other, the whole grid is repeated ``num_samples`` times, and each
variant samples its own value for every :class:`~popflow.schedulers.search_space.Domain`.
Plain values, lists included, are copied unchanged; lists are not search
spaces (use ``choice``), though a domain inside a list is sampled.

Order, as in Ray: samples outermost; within one sample, grid axes sorted by
their key path with the first axis varying fastest. Within one variant,
domains are sampled in the order they appear in ``param_space`` and
``sample_from`` functions run last, so they see the sampled and plain values
(and the results of other ``sample_from`` functions they read). Same
``param_space``, ``num_samples`` and generator state: same variants.

    >>> import numpy as np
    >>> from popflow.schedulers.search_space import grid_search, uniform
    >>> space = {"act": grid_search(["relu", "tanh"]), "lr": uniform(0.1, 0.2), "layers": [64, 64]}
    >>> variants = resolve_variants(space, num_samples=2, rng=np.random.default_rng(0))
    >>> [v.config["act"] for v in variants]
    ['relu', 'tanh', 'relu', 'tanh']
    >>> variants[0].tag
    '0_act=relu,lr=0.1637'
    >>> variants[0].config["layers"]
    [64, 64]
"""

from __future__ import annotations

import copy
import itertools
import numbers
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from popflow.schedulers.domains import Domain, SampleFrom
from popflow.schedulers.search_space import GRID_SEARCH_KEY, is_grid_search

#: A position in a nested config: dict keys and list indices, outermost first.
Path = tuple[Any, ...]


@dataclass(frozen=True)
class Variant:
    """One generated trial config.

    ``resolved_vars`` maps the path of every sampled or grid-searched value
    to its value in ``config`` (a grid value that holds searched values of
    its own is represented by those); ``tag`` is Ray's ``experiment_tag``:
    ``f"{index}_{format_vars(resolved_vars)}"``, or ``str(index)`` when
    nothing was searched.
    """

    index: int
    config: dict[str, Any]
    resolved_vars: dict[Path, Any]

    @property
    def tag(self) -> str:
        formatted = format_vars(self.resolved_vars)
        return f"{self.index}_{formatted}" if formatted else str(self.index)

    @property
    def evaluated_params(self) -> dict[str, Any]:
        """Ray's ``Trial.evaluated_params``: the resolved values keyed by their path
        joined with "/" (``{"model/lr": 0.01}``)."""
        return {"/".join(str(k) for k in path): v for path, v in self.resolved_vars.items()}


def generate_variants(
    param_space: Mapping[str, Any], num_samples: int, rng: np.random.Generator
) -> list[dict[str, Any]]:
    """The configs of :func:`resolve_variants`, in the same order.

    >>> import numpy as np
    >>> from popflow.schedulers.search_space import grid_search
    >>> generate_variants({"a": grid_search([1, 2]), "b": 0}, 1, np.random.default_rng(0))
    [{'a': 1, 'b': 0}, {'a': 2, 'b': 0}]
    """
    return [variant.config for variant in resolve_variants(param_space, num_samples, rng)]


def resolve_variants(
    param_space: Mapping[str, Any], num_samples: int, rng: np.random.Generator
) -> list[Variant]:
    """``num_samples`` times (product of grid sizes) variants, each with its tag.

    ``param_space`` is never modified; every returned config is a fresh
    structure (plain values are deep-copied), so trials share nothing.
    """
    _validate(param_space, num_samples)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"`rng` is {rng!r}, but must be a numpy.random.Generator")
    grid = _expand_grids(param_space, ())
    variants = []
    for _ in range(num_samples):
        for spec, grid_paths in grid:
            config, sampled_paths = _resolve(spec, rng)
            resolved_vars = {
                path: _get(config, path) for path in _var_paths(grid_paths, sampled_paths)
            }
            variants.append(Variant(len(variants), config, resolved_vars))
    return variants


def count_variants(param_space: Mapping[str, Any], num_samples: int) -> int:
    """How many variants :func:`generate_variants` returns, without sampling.

    >>> from popflow.schedulers.search_space import grid_search
    >>> count_variants({"a": grid_search([1, 2]), "b": grid_search(["x", "y", "z"])}, 4)
    24
    """
    _validate(param_space, num_samples)
    return len(_expand_grids(param_space, ())) * num_samples


def format_vars(resolved_vars: Mapping[Path | str, Any]) -> str:
    """Ray's tag text for resolved values: ``"act=relu,lr=0.01"``.

    Keys are paths (a plain string counts as a one-key path); entries are
    sorted by full path and named by the path's last key. Floats get 5
    significant digits (``f"{v:.5g}"``); anything else is ``str(v)`` with
    characters outside ``[a-zA-Z0-9_-]`` collapsed to ``_``, so tags are safe
    in directory names.

    >>> format_vars({("model", "lr"): 0.0123456789, ("act",): "relu", "layers": [64, 64]})
    'act=relu,layers=64_64,lr=0.012346'
    """
    items = sorted(
        ((_as_path(key), value) for key, value in resolved_vars.items()),
        key=lambda item: _path_sort_key(item[0]),
    )
    return ",".join(f"{_clean(path[-1])}={_clean_value(value)}" for path, value in items)


# -- validation -------------------------------------------------------------------
def _validate(param_space: Any, num_samples: Any) -> None:
    if not isinstance(param_space, Mapping):
        raise TypeError(f"`param_space` is {param_space!r}, but must be a dict")
    if isinstance(num_samples, bool) or not isinstance(num_samples, numbers.Integral):
        raise TypeError(f"`num_samples` is {num_samples!r}, but must be an integer")
    if num_samples < 1:
        raise ValueError(f"`num_samples` is {num_samples}, but must be >= 1")


def _as_path(key: Path | str) -> Path:
    return key if isinstance(key, tuple) else (key,)


def _path_text(path: Path) -> str:
    return "/".join(str(key) for key in path) or "<root>"


def _path_sort_key(path: Path) -> tuple[str, ...]:
    return tuple(str(key) for key in path)


# -- walking nested configs ---------------------------------------------------------
def _is_container(value: Any) -> bool:
    return isinstance(value, Mapping) or type(value) in (list, tuple)


def _children(value: Any) -> Iterator[tuple[Any, Any]]:
    return iter(value.items()) if isinstance(value, Mapping) else enumerate(value)


def _grid_axes(value: Any, path: Path) -> Iterator[tuple[Path, list[Any]]]:
    """Every grid_search marker under ``value``, with its path, in traversal order."""
    if is_grid_search(value):
        values = value[GRID_SEARCH_KEY]
        if isinstance(values, str | bytes) or not isinstance(values, list | tuple):
            raise TypeError(
                f"grid_search at `{_path_text(path)}` is {values!r}, but must be a list of values"
            )
        if not values:
            raise ValueError(f"grid_search at `{_path_text(path)}` is empty, but needs a value")
        yield path, list(values)
    elif _is_container(value):
        for key, child in _children(value):
            yield from _grid_axes(child, (*path, key))


def _get(value: Any, path: Path) -> Any:
    for key in path:
        value = value[key]
    return value


def _assign(value: Any, path: Path, new: Any) -> Any:
    """A copy of ``value`` with ``new`` at ``path``; only the containers on the path are copied."""
    if not path:
        return new
    key, rest = path[0], path[1:]
    if isinstance(value, Mapping):
        return {**value, key: _assign(value[key], rest, new)}
    items = list(value)
    items[key] = _assign(items[key], rest, new)
    return type(value)(items)


def _expand_grids(spec: Any, grid_paths: tuple[Path, ...]) -> list[tuple[Any, tuple[Path, ...]]]:
    """The cross product of ``spec``'s grid axes: (spec without markers, grid paths) pairs.

    Axes are sorted by path and the first varies fastest, as in Ray. A chosen
    grid value may hold grids of its own; those are expanded in turn.
    """
    axes = sorted(_grid_axes(spec, ()), key=lambda axis: _path_sort_key(axis[0]))
    if not axes:
        return [(spec, grid_paths)]
    paths = [path for path, _ in axes]
    expanded = []
    # itertools.product varies its last argument fastest, so feed the axes reversed.
    for combo in itertools.product(*(values for _, values in reversed(axes))):
        chosen = spec
        for path, value in zip(paths, reversed(combo), strict=True):
            chosen = _assign(chosen, path, value)
        expanded.extend(_expand_grids(chosen, (*grid_paths, *paths)))
    return expanded


# -- resolving one variant ------------------------------------------------------------
class _Pending:
    """Placeholder for a sample_from value not computed yet."""

    __slots__ = ("path",)

    def __init__(self, path: Path) -> None:
        self.path = path

    def __repr__(self) -> str:
        return f"<unresolved sample_from at {_path_text(self.path)}>"


class _Unresolved(Exception):
    """A sample_from function read a value that is itself a pending sample_from."""


class _SpecView(dict[Any, Any]):
    """The config as a sample_from function sees it.

    A dict (``spec["lr"]``) that also allows attribute access and Ray's
    ``spec.config.lr`` form. Reading a pending sample_from value defers the
    reading function until that value is known.
    """

    __slots__ = ()

    @classmethod
    def of(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return cls({key: cls.of(child) for key, child in value.items()})
        if type(value) in (list, tuple):
            return type(value)(cls.of(child) for child in value)
        return value

    def __getitem__(self, key: Any) -> Any:
        value = super().__getitem__(key)
        if isinstance(value, _Pending):
            raise _Unresolved(value.path)
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        # dict.get bypasses __getitem__; route through it to guard pending values.
        if key in self:
            return self[key]
        return default

    def __getattr__(self, name: str) -> Any:
        if name in self:
            return self[name]
        if name == "config":  # Ray hands sample_from a spec whose .config is the config
            return self
        raise AttributeError(f"the config has no key {name!r}")


def _resolve(spec: Any, rng: np.random.Generator) -> tuple[dict[str, Any], list[Path]]:
    """A fresh config with every domain sampled; also the paths that were sampled."""
    sampled: list[Path] = []
    pending: list[tuple[Path, SampleFrom]] = []

    def build(value: Any, path: Path) -> Any:
        if isinstance(value, SampleFrom):
            sampled.append(path)
            pending.append((path, value))
            return _Pending(path)
        if isinstance(value, Domain):
            sampled.append(path)
            return value.sample(rng)
        if isinstance(value, Mapping):
            return {key: build(child, (*path, key)) for key, child in value.items()}
        if type(value) in (list, tuple):
            return type(value)(build(child, (*path, i)) for i, child in enumerate(value))
        return copy.deepcopy(value)

    config = build(spec, ())
    # sample_from runs after every plain value and domain; one that reads a
    # still-pending sample_from is retried after the others, until none is left.
    while pending:
        deferred = []
        for path, domain in pending:
            try:
                value = domain.sample(rng, _SpecView.of(config))
            except _Unresolved:
                deferred.append((path, domain))
                continue
            config = _set_in_place(config, path, value)
        if len(deferred) == len(pending):
            where = ", ".join(f"`{_path_text(path)}`" for path, _ in deferred)
            raise ValueError(
                f"sample_from at {where} cannot be resolved: each reads another "
                "sample_from value that is still unresolved (a cycle)"
            )
        pending = deferred
    return config, sampled


def _set_in_place(config: Any, path: Path, value: Any) -> Any:
    """Put ``value`` at ``path`` in a config this module built (so owns); returns the root."""
    if not path:
        return value
    parent = _get(config, path[:-1])
    if isinstance(parent, tuple):  # tuples are immutable: rebuild up the path
        items = list(parent)
        items[path[-1]] = value
        return _set_in_place(config, path[:-1], tuple(items))
    parent[path[-1]] = value
    return config


# -- tags -------------------------------------------------------------------------------
def _var_paths(grid_paths: tuple[Path, ...], sampled_paths: list[Path]) -> list[Path]:
    """Searched paths, sorted; a grid value holding searched values is named by those instead."""
    paths = {*grid_paths, *sampled_paths}
    return sorted(
        (p for p in paths if not any(len(o) > len(p) and o[: len(p)] == p for o in paths)),
        key=_path_sort_key,
    )


_INVALID_TAG_CHARS = re.compile(r"[^a-zA-Z0-9_-]+")


def _clean(value: Any) -> str:
    return _INVALID_TAG_CHARS.sub("_", str(value)).strip("_")


def _clean_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.5g}"
    return _clean(value)
