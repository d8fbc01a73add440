"""Ray Tune's search-space API, sampled only from an injected ``numpy.random.Generator``.

Each factory (``uniform``, ``loguniform``, ``choice``, ...) validates its
arguments at once and returns a frozen :class:`Domain`; ``domain.sample(rng)``
draws one value as a plain Python ``int``/``float`` (configs get
JSON-serialised). ``grid_search`` returns Ray's ``{"grid_search": [...]}``
marker, so a pasted Ray ``param_space`` means the same thing here.

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> lr = loguniform(1e-4, 1e-1)
    >>> 1e-4 <= lr.sample(rng) <= 1e-1
    True
    >>> qrandint(32, 256, 32).sample(rng) % 32
    0
    >>> grid_search([1, 2])
    {'grid_search': [1, 2]}

Bounds follow Ray 2.60: ``randint`` and ``lograndint`` exclude ``upper``;
``qrandint`` and ``qlograndint`` include it, except with ``q=1`` (then they are
``randint`` and ``lograndint``); quantized floats round to the nearest multiple of
``q`` (``np.round(x / q) * q``) of a draw between the bounds snapped inwards to
multiples of ``q``, and quantized integers draw the multiple itself (each equally
likely, or log-uniformly). Where Ray refuses float bounds that are not multiples of
``q``, popflow snaps them inwards, as Ray does for integer bounds; samples always
lie inside ``[lower, upper]``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from popflow.schedulers.domains import (
    Categorical,
    Domain,
    LogRandInt,
    LogUniform,
    Normal,
    QLogRandInt,
    QLogUniform,
    QNormal,
    QRandInt,
    QUniform,
    RandInt,
    SampleFrom,
    Uniform,
)

GRID_SEARCH_KEY = "grid_search"


# -- factories (Ray Tune's names and argument names) ----------------------------------
def uniform(lower: float, upper: float) -> Uniform:
    """Float uniform in ``[lower, upper)``.

    >>> import numpy as np
    >>> 0.0 <= uniform(0, 1).sample(np.random.default_rng(0)) < 1.0
    True
    """
    return Uniform(lower, upper)


def quniform(lower: float, upper: float, q: float) -> QUniform:
    """Float uniform in ``[lower, upper]``, rounded to a multiple of ``q``.

    >>> import numpy as np
    >>> quniform(0, 10, 2.5).sample(np.random.default_rng(0)) in (0.0, 2.5, 5.0, 7.5, 10.0)
    True
    """
    return QUniform(lower, upper, q)


def loguniform(lower: float, upper: float, base: float = 10) -> LogUniform:
    """Float in ``[lower, upper]`` with ``log(value)`` uniform; needs ``lower > 0``.

    >>> import numpy as np
    >>> 1e-4 <= loguniform(1e-4, 1e-1).sample(np.random.default_rng(0)) <= 1e-1
    True
    """
    return LogUniform(lower, upper, base)


def qloguniform(lower: float, upper: float, q: float, base: float = 10) -> QLogUniform:
    """Log-uniform float in ``[lower, upper]``, rounded to a multiple of ``q``.

    >>> import numpy as np
    >>> v = qloguniform(1e-4, 1e-1, 5e-5).sample(np.random.default_rng(0))
    >>> 1e-4 <= v <= 1e-1 and abs(v / 5e-5 - round(v / 5e-5)) < 1e-6
    True
    """
    return QLogUniform(lower, upper, q, base)


def randn(mean: float = 0.0, sd: float = 1.0) -> Normal:
    """Float from a normal distribution with mean ``mean`` and standard deviation ``sd``.

    >>> import numpy as np
    >>> isinstance(randn(0, 1).sample(np.random.default_rng(0)), float)
    True
    """
    return Normal(mean, sd)


def qrandn(mean: float, sd: float, q: float) -> QNormal:
    """Float from a normal distribution, rounded to the nearest multiple of ``q``.

    >>> import numpy as np
    >>> v = qrandn(10, 2, 0.5).sample(np.random.default_rng(0))
    >>> v == round(v / 0.5) * 0.5
    True
    """
    return QNormal(mean, sd, q)


def randint(lower: int, upper: int) -> RandInt:
    """Integer uniform in ``[lower, upper)``: ``upper`` is excluded, as in Ray.

    >>> import numpy as np
    >>> randint(0, 3).sample(np.random.default_rng(0)) in (0, 1, 2)
    True
    """
    return RandInt(lower, upper)


def qrandint(lower: int, upper: int, q: int = 1) -> QRandInt:
    """Integer multiple of ``q`` in ``[lower, upper]``, each equally likely; ``upper`` is
    included except with ``q=1`` (as in Ray 2.60).

    >>> import numpy as np
    >>> qrandint(0, 100, 25).sample(np.random.default_rng(0)) in (0, 25, 50, 75, 100)
    True
    >>> qrandint(0, 3).sample(np.random.default_rng(0)) in (0, 1, 2)
    True
    """
    return QRandInt(lower, upper, q)


def lograndint(lower: int, upper: int, base: float = 10) -> LogRandInt:
    """Integer in ``[lower, upper)`` with ``log(value)`` uniform; needs ``lower > 0``.

    >>> import numpy as np
    >>> 1 <= lograndint(1, 1000).sample(np.random.default_rng(0)) < 1000
    True
    """
    return LogRandInt(lower, upper, base)


def qlograndint(lower: int, upper: int, q: int, base: float = 10) -> QLogRandInt:
    """Integer multiple of ``q`` in ``[lower, upper]`` with ``log(value)`` uniform; needs
    ``lower > 0``; ``upper`` is included except with ``q=1`` (as in Ray 2.60).

    >>> import numpy as np
    >>> qlograndint(1, 10, 2).sample(np.random.default_rng(0)) in (2, 4, 6, 8, 10)
    True
    """
    return QLogRandInt(lower, upper, q, base)


def choice(categories: Sequence[Any]) -> Categorical:
    """One of ``categories``, each equally likely.

    >>> import numpy as np
    >>> choice(["relu", "tanh"]).sample(np.random.default_rng(0)) in ("relu", "tanh")
    True
    """
    return Categorical(categories)


def sample_from(func: Callable[..., Any]) -> SampleFrom:
    """A value computed from the rest of the config when variants are generated.

    ``func(spec)`` receives the config resolved so far (``spec["lr"]``; Ray's
    ``spec.config.lr`` also works); ``func()`` with no arguments is accepted
    too. A function that draws from ``np.random`` or ``random`` repeats with the
    run's seed: the driver seeds both from it before sampling.

    >>> import numpy as np
    >>> sample_from(lambda spec: spec["a"] * 2).sample(np.random.default_rng(0), {"a": 3})
    6
    """
    return SampleFrom(func)


def grid_search(values: Iterable[Any]) -> dict[str, list[Any]]:
    """Ray's grid marker ``{"grid_search": [...]}``: a variant per value, crossed with other grids.

    >>> grid_search(["relu", "tanh"])
    {'grid_search': ['relu', 'tanh']}
    """
    if isinstance(values, str | bytes | Mapping) or not isinstance(values, Iterable):
        raise TypeError(f"`values` is {values!r}, but must be a list of values")
    values = list(values)
    if not values:
        raise ValueError("`values` is empty, but grid_search needs at least one value")
    return {GRID_SEARCH_KEY: values}


def is_grid_search(value: Any) -> bool:
    """True for a ``{"grid_search": [...]}`` marker (from :func:`grid_search` or pasted JSON)."""
    return isinstance(value, Mapping) and len(value) == 1 and GRID_SEARCH_KEY in value


def has_search_spaces(space: Any) -> bool:
    """``space`` (a config, nested) holds a domain or a ``grid_search`` anywhere.

    >>> has_search_spaces({"a": 1, "b": {"c": uniform(0, 1)}}), has_search_spaces({"a": [1]})
    (True, False)
    """
    if isinstance(space, Domain) or is_grid_search(space):
        return True
    if isinstance(space, Mapping):
        return any(has_search_spaces(v) for v in space.values())
    if isinstance(space, list | tuple):
        return any(has_search_spaces(v) for v in space)
    return False


def flat_keys(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one dict with ``/``-joined keys (a grid_search marker, or an empty
    dict, is a leaf): what search libraries and trackers take."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value and not is_grid_search(value):
            out.update(flat_keys(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def nested_keys(params: dict[str, Any]) -> dict[str, Any]:
    """``/``-joined keys as nested dicts again."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        *parents, leaf = key.split("/")
        node = out
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return out
