"""The distributions behind Ray Tune's search-space functions (:mod:`popflow.schedulers.search_space`).

Each :class:`Domain` is frozen and validated when built; ``sample(rng)``
draws one value as a plain Python ``int``/``float`` using only the given
``numpy.random.Generator``.
"""

from __future__ import annotations

import copy
import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from popflow.schedulers.domain_checks import (
    check_base,
    check_less,
    clip,
    float_multiples,
    int_multiples,
    integer,
    log_sample,
    real,
    round_index,
)
from popflow.schedulers.validation import check_positive


class Domain(ABC):
    """A distribution over one hyperparameter's values.

    ``is_categorical`` is True for :func:`choice` (unordered values: resample
    or shift, no arithmetic); every other domain is numeric. ``is_integer``
    is True when samples are Python ``int``.
    """

    is_categorical: ClassVar[bool] = False
    is_integer: ClassVar[bool] = False

    @abstractmethod
    def sample(self, rng: np.random.Generator) -> Any:
        """Draw one value, using only ``rng`` for randomness."""


# -- float domains --------------------------------------------------------------
@dataclass(frozen=True)
class Uniform(Domain):
    """Floats uniform in ``[lower, upper)``; see :func:`uniform`."""

    lower: float
    upper: float

    def __post_init__(self) -> None:
        lower, upper = real("lower", self.lower), real("upper", self.upper)
        check_less(self.lower, self.upper)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)

    def sample(self, rng: np.random.Generator) -> float:
        return clip(float(rng.uniform(self.lower, self.upper)), self.lower, self.upper)


@dataclass(frozen=True)
class QUniform(Domain):
    """Uniform floats rounded to a multiple of ``q``, within ``[lower, upper]``."""

    lower: float
    upper: float
    q: float
    _k_range: tuple[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lower, upper, q = real("lower", self.lower), real("upper", self.upper), real("q", self.q)
        check_less(self.lower, self.upper)
        check_positive("q", self.q)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "q", q)
        object.__setattr__(self, "_k_range", float_multiples(lower, upper, q))

    def sample(self, rng: np.random.Generator) -> float:
        # Ray: uniform between the bounds snapped to the grid, then rounded to it
        k_lo, k_hi = self._k_range
        x = float(rng.uniform(k_lo * self.q, k_hi * self.q))
        return clip(round_index(x, self.q, k_lo, k_hi) * self.q, self.lower, self.upper)


@dataclass(frozen=True)
class LogUniform(Domain):
    """Floats whose logarithm is uniform, within ``[lower, upper]``."""

    lower: float
    upper: float
    base: float = 10

    def __post_init__(self) -> None:
        lower, upper = real("lower", self.lower), real("upper", self.upper)
        check_positive("lower", self.lower)
        check_less(self.lower, self.upper)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "base", check_base(self.base))

    def sample(self, rng: np.random.Generator) -> float:
        return clip(log_sample(rng, self.lower, self.upper, self.base), self.lower, self.upper)


@dataclass(frozen=True)
class QLogUniform(Domain):
    """Log-uniform floats rounded to a multiple of ``q``, within ``[lower, upper]``."""

    lower: float
    upper: float
    q: float
    base: float = 10
    _k_range: tuple[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lower, upper, q = real("lower", self.lower), real("upper", self.upper), real("q", self.q)
        check_positive("lower", self.lower)
        check_less(self.lower, self.upper)
        check_positive("q", self.q)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "q", q)
        object.__setattr__(self, "base", check_base(self.base))
        k_lo, k_hi = float_multiples(lower, upper, q)
        if k_hi < 1:  # 0 is no log-uniform value
            raise ValueError(f"`q` is {q}, but must be <= `upper` ({upper})")
        object.__setattr__(self, "_k_range", (max(k_lo, 1), k_hi))

    def sample(self, rng: np.random.Generator) -> float:
        k_lo, k_hi = self._k_range
        x = log_sample(rng, k_lo * self.q, k_hi * self.q, self.base)
        return clip(round_index(x, self.q, k_lo, k_hi) * self.q, self.lower, self.upper)


@dataclass(frozen=True)
class Normal(Domain):
    """Normally distributed floats; see :func:`randn`."""

    mean: float = 0.0
    sd: float = 1.0

    def __post_init__(self) -> None:
        mean, sd = real("mean", self.mean), real("sd", self.sd)
        check_positive("sd", self.sd)
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "sd", sd)

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.normal(self.mean, self.sd))


@dataclass(frozen=True)
class QNormal(Domain):
    """Normal floats rounded to the nearest multiple of ``q``; see :func:`qrandn`."""

    mean: float
    sd: float
    q: float

    def __post_init__(self) -> None:
        mean, sd, q = real("mean", self.mean), real("sd", self.sd), real("q", self.q)
        check_positive("sd", self.sd)
        check_positive("q", self.q)
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "sd", sd)
        object.__setattr__(self, "q", q)

    def sample(self, rng: np.random.Generator) -> float:
        return float(int(np.round(rng.normal(self.mean, self.sd) / self.q)) * self.q)


# -- integer domains ------------------------------------------------------------
@dataclass(frozen=True)
class RandInt(Domain):
    """Integers uniform in ``[lower, upper)`` (``upper`` excluded, as in Ray)."""

    is_integer: ClassVar[bool] = True

    lower: int
    upper: int

    def __post_init__(self) -> None:
        lower, upper = integer("lower", self.lower), integer("upper", self.upper)
        check_less(self.lower, self.upper)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)

    def sample(self, rng: np.random.Generator) -> int:
        return int(rng.integers(self.lower, self.upper))


@dataclass(frozen=True)
class QRandInt(Domain):
    """Integers, multiples of ``q``, uniform over the multiples in ``[lower, upper]``:
    ``upper`` included, except with ``q=1`` (as in Ray 2.60: ``qrandint(0, 3)`` is 0..2)."""

    is_integer: ClassVar[bool] = True

    lower: int
    upper: int
    q: int = 1
    _k_range: tuple[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lower, upper = integer("lower", self.lower), integer("upper", self.upper)
        q = integer("q", self.q)
        if not lower <= upper:
            raise ValueError(f"`lower` is {self.lower}, but must be <= `upper` ({self.upper})")
        check_positive("q", self.q)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "q", q)
        object.__setattr__(self, "_k_range", int_multiples(lower, upper, q, upper_excluded=q == 1))

    @property
    def first(self) -> int:
        """The smallest value a sample takes."""
        return self._k_range[0] * self.q

    @property
    def last(self) -> int:
        """The largest value a sample takes."""
        return self._k_range[1] * self.q

    def sample(self, rng: np.random.Generator) -> int:
        # Ray: each multiple equally likely (a uniform grid index), not a rounded draw
        return int(rng.integers(self._k_range[0], self._k_range[1], endpoint=True)) * self.q


@dataclass(frozen=True)
class LogRandInt(Domain):
    """Integers in ``[lower, upper)`` whose logarithm is uniform (floor of a log-uniform)."""

    is_integer: ClassVar[bool] = True

    lower: int
    upper: int
    base: float = 10

    def __post_init__(self) -> None:
        lower, upper = integer("lower", self.lower), integer("upper", self.upper)
        check_positive("lower", self.lower)
        check_less(self.lower, self.upper)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "base", check_base(self.base))

    def sample(self, rng: np.random.Generator) -> int:
        x = math.floor(log_sample(rng, self.lower, self.upper, self.base))
        return min(max(x, self.lower), self.upper - 1)


@dataclass(frozen=True)
class QLogRandInt(Domain):
    """Integers, multiples of ``q``, log-uniform over the multiples in ``[lower, upper]``:
    ``upper`` included, except with ``q=1``; see :func:`qlograndint`."""

    is_integer: ClassVar[bool] = True

    lower: int
    upper: int
    q: int
    base: float = 10
    _k_range: tuple[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lower, upper = integer("lower", self.lower), integer("upper", self.upper)
        q = integer("q", self.q)
        check_positive("lower", self.lower)
        check_less(self.lower, self.upper)
        check_positive("q", self.q)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "q", q)
        object.__setattr__(self, "base", check_base(self.base))
        object.__setattr__(self, "_k_range", int_multiples(lower, upper, q, upper_excluded=q == 1))

    @property
    def first(self) -> int:
        """The smallest value a sample takes."""
        return self._k_range[0] * self.q

    @property
    def last(self) -> int:
        """The largest value a sample takes."""
        return self._k_range[1] * self.q

    def sample(self, rng: np.random.Generator) -> int:
        # Ray: the floor of a log-uniform grid index in [k_lo, k_hi + 1)
        k_lo, k_hi = self._k_range
        k = math.floor(log_sample(rng, k_lo, k_hi + 1, self.base))
        return min(max(k, k_lo), k_hi) * self.q


# -- categorical and function domains ---------------------------------------------
@dataclass(frozen=True)
class Categorical(Domain):
    """One of ``categories``, uniformly; see :func:`choice`."""

    is_categorical: ClassVar[bool] = True

    categories: Sequence[Any]

    def __post_init__(self) -> None:
        categories = self.categories
        if isinstance(categories, np.ndarray):
            categories = categories.tolist()  # Python scalars, not numpy ones
        if isinstance(categories, str | bytes) or not isinstance(categories, Sequence):
            raise TypeError(
                f"`categories` is {categories!r}, but must be an ordered sequence such as a list"
            )
        if len(categories) == 0:
            raise ValueError("`categories` is empty, but must hold at least one value")
        object.__setattr__(self, "categories", tuple(categories))

    def sample(self, rng: np.random.Generator) -> Any:
        # A copy, so trials never share a mutable category (a list, a dict).
        return copy.deepcopy(self.categories[int(rng.integers(len(self.categories)))])


def _accepts_one_positional(func: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # some builtins have no signature: assume Ray's form
        return True
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return any(
        p.kind in positional or p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters
    )


@dataclass(frozen=True)
class SampleFrom(Domain):
    """A value computed by ``func`` from the rest of the config; see :func:`sample_from`."""

    func: Callable[..., Any]
    _takes_spec: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not callable(self.func):
            raise TypeError(f"`func` is {self.func!r}, but must be callable")
        object.__setattr__(self, "_takes_spec", _accepts_one_positional(self.func))

    def sample(self, rng: np.random.Generator, spec: Mapping[str, Any] | None = None) -> Any:
        """Call ``func(spec)`` (or ``func()`` for a zero-argument function).

        ``rng`` is unused: ``func`` owns its randomness. ``spec`` is the
        resolved config (``{}`` if not given).
        """
        if self._takes_spec:
            return self.func({} if spec is None else spec)
        return self.func()
