"""PBT's explore step and the helpers around ``hyperparam_mutations``.

Explore as in Jaderberg et al., "Population Based Training of Neural Networks"
(2017), https://arxiv.org/abs/1711.09846: perturb or resample the copied config.

A mutation spec maps each hyperparameter to how it may change (Ray Tune's format):

- ``dict``: nested hyperparameters, explored recursively;
- ``list`` / ``tuple``: an ordered categorical set; perturbing shifts the value
  to a neighbouring index, resampling picks uniformly from the set;
- a callable (``lambda: random.uniform(0, 1)``) or a search-space ``Domain``
  (``uniform(0, 1)``): a continuous parameter; perturbing multiplies it by one
  of ``perturbation_factors``, resampling calls it / samples it.

Example::

    >>> import numpy as np
    >>> new, ops = explore({"lr": 0.1, "bs": 32}, {"lr": lambda: 0.5, "bs": [16, 32, 64]},
    ...                    resample_probability=0.0, perturbation_factors=(2.0,),
    ...                    custom_explore_fn=None, rng=np.random.default_rng(0))
    >>> new["lr"], ops["lr"]
    (0.2, '* 2.0')
"""

from __future__ import annotations

import copy
import numbers
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from popflow.schedulers.domains import Domain, SampleFrom

__all__ = ["explore", "fill_missing", "missing_paths", "perturbed_tag", "validate_mutations"]

ExploreFn = Callable[[dict[str, Any]], dict[str, Any]]


def validate_mutations(mutations: Mapping[str, Any], prefix: str = "") -> None:
    """Raise ValueError for a spec value that is not dict, list/tuple, callable or Domain."""
    for key, spec in mutations.items():
        path = f"{prefix}{key}"
        if isinstance(spec, dict):
            validate_mutations(spec, prefix=f"{path}/")
        elif isinstance(spec, list | tuple):
            if not spec:
                raise ValueError(
                    f"`hyperparam_mutations['{path}']` is an empty {type(spec).__name__}, "
                    "but a categorical mutation needs at least one value"
                )
        elif isinstance(spec, SampleFrom):
            raise ValueError(
                f"`hyperparam_mutations['{path}']` is a sample_from() domain, but arbitrary "
                "sample_from objects are not supported (as in Ray): use uniform(), "
                "loguniform(), choice(), ... or a plain callable"
            )
        elif not (isinstance(spec, Domain) or callable(spec)):
            raise ValueError(
                f"`hyperparam_mutations['{path}']` is {spec!r} (type {type(spec).__name__}), "
                "but must be a dict (nested), a list/tuple (categorical), a callable "
                "or a search-space Domain (continuous)"
            )


def _sample(spec: Any, rng: np.random.Generator) -> Any:
    if isinstance(spec, Domain):
        return spec.sample(rng)
    if isinstance(spec, list | tuple):
        # Index, not rng.choice: keep the element's own type (no numpy scalars).
        return copy.deepcopy(spec[int(rng.integers(len(spec)))])
    return spec()


def fill_missing(
    config: Mapping[str, Any], mutations: Mapping[str, Any], rng: np.random.Generator
) -> dict[str, Any]:
    """A copy of ``config`` with every mutation key it lacks sampled from its spec."""
    filled = copy.deepcopy(dict(config))
    _fill_into(filled, mutations, rng)
    return filled


def _fill_into(config: dict[str, Any], mutations: Mapping[str, Any], rng: np.random.Generator):
    for key, spec in mutations.items():
        if isinstance(spec, dict):
            if key not in config:
                config[key] = {}
            if isinstance(config[key], dict):
                _fill_into(config[key], spec, rng)
        elif key not in config:
            config[key] = _sample(spec, rng)


def missing_paths(
    config: Mapping[str, Any], mutations: Mapping[str, Any], prefix: str = ""
) -> Iterator[str]:
    """The ``a/b`` paths of mutation keys that ``config`` lacks."""
    for key, spec in mutations.items():
        path = f"{prefix}{key}"
        if key not in config:
            yield path
        elif isinstance(spec, dict) and isinstance(config[key], Mapping):
            yield from missing_paths(config[key], spec, prefix=f"{path}/")


def _keep_type(old: Any, new: Any) -> Any:
    """Ints stay ints (rounded), bools stay bools, floats stay floats."""
    if not isinstance(new, numbers.Real):
        return new
    if isinstance(old, bool | np.bool_):
        return bool(new)
    if isinstance(old, numbers.Integral):
        return round(float(new))
    if isinstance(old, float) and not isinstance(new, float):
        return float(new)
    return new


def explore(
    config: Mapping[str, Any],
    mutations: Mapping[str, Any],
    resample_probability: float,
    perturbation_factors: Sequence[float],
    custom_explore_fn: ExploreFn | None,
    rng: np.random.Generator,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Perturb ``config`` as specified by ``mutations`` (Ray Tune's ``_explore``).

    Returns the new config and an operations log, one entry per mutated key:
    ``"resample"``, ``"* 1.2"``, ``"shift left"``, ``"shift right"``, or
    ``"shift left (noop)"`` when the value already sits at that edge of the set.
    Nested keys are logged flat as ``"outer/inner"``. ``custom_explore_fn(config)``
    runs last, on the new config, and must return a dict. Inputs are not mutated;
    all randomness comes from ``rng``.
    """
    new_config = copy.deepcopy(dict(config))
    operations: dict[str, str] = {}
    _explore_into(
        new_config,
        config,
        mutations,
        resample_probability,
        perturbation_factors,
        rng,
        operations,
        prefix="",
    )
    if custom_explore_fn is not None:
        result = custom_explore_fn(new_config)
        if not isinstance(result, dict):
            raise TypeError(
                f"`custom_explore_fn` returned {result!r} (type {type(result).__name__}), "
                "but must return the new config as a dict"
            )
        new_config = result
    return new_config, operations


def _explore_into(
    new: dict[str, Any],
    old: Mapping[str, Any],
    mutations: Mapping[str, Any],
    resample_probability: float,
    factors: Sequence[float],
    rng: np.random.Generator,
    operations: dict[str, str],
    prefix: str,
) -> None:
    for key, spec in mutations.items():
        path = f"{prefix}{key}"
        if key not in old:
            raise ValueError(
                f"cannot explore `{path}`: the config has no such key "
                "(complete_config() samples missing mutation keys)"
            )
        value = old[key]
        if isinstance(spec, dict):
            if not isinstance(value, Mapping):
                raise ValueError(f"cannot explore `{path}`: {value!r} is not a nested dict")
            sub_args = (resample_probability, factors, rng, operations)
            _explore_into(new[key], value, spec, *sub_args, prefix=f"{path}/")
        elif isinstance(spec, list | tuple):
            # Draw the coin first, as Ray does, so the stream does not depend on `value`.
            if rng.random() < resample_probability or value not in spec:
                new[key] = _sample(spec, rng)
                operations[path] = "resample"
            else:
                shift = -1 if rng.integers(2) == 0 else 1
                old_idx = list(spec).index(value)
                new_idx = min(max(old_idx + shift, 0), len(spec) - 1)
                new[key] = copy.deepcopy(spec[new_idx])
                side = "left" if shift < 0 else "right"
                operations[path] = f"shift {side}" + (" (noop)" if new_idx == old_idx else "")
        else:
            if rng.random() < resample_probability:
                new_value = _sample(spec, rng)
                operations[path] = "resample"
            else:
                factor = factors[int(rng.integers(len(factors)))]
                if not isinstance(value, numbers.Real):
                    raise TypeError(
                        f"cannot perturb `{path}` = {value!r}: a continuous mutation "
                        "multiplies a number by a perturbation factor"
                    )
                new_value = value * factor
                operations[path] = f"* {factor}"
            new[key] = _keep_type(value, new_value)


def _clean(value: Any) -> str:
    """Tag-safe text: floats to 4 decimals, other characters outside [A-Za-z0-9_-] to ``_``."""
    if isinstance(value, float):
        return f"{value:.4f}"
    return re.sub(r"[^a-zA-Z0-9_-]+", "_", str(value)).strip("_")


def perturbed_tag(orig_tag: str, config: Mapping[str, Any], mutations: Mapping[str, Any]) -> str:
    """Ray's experiment tag after an exploit: ``"<orig_tag>@perturbed[lr=0.0120,bs=64]"``."""
    parts = ",".join(f"{_clean(k)}={_clean(config[k])}" for k in sorted(mutations) if k in config)
    return f"{orig_tag}@perturbed[{parts}]"
