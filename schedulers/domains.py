"""The distributions behind Ray Tune's search-space functions (:mod:`popflow.schedulers.search_space`).

Each :class:`Domain` is frozen and validated when built; ``sample(rng)``
draws one value as a plain Python ``int``/``float`` using only the given
``numpy.random.Generator``.
"""

from __future__ import annotations

import copy
import inspect
import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from popflow.schedulers.validation import check_positive

# Relative slack for "is this bound a multiple of q" under float rounding.
_Q_TOLERANCE = 1e-9


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


# -- validation helpers -------------------------------------------------------
def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"`{name}` is {value!r}, but must be a real number")
    if not math.isfinite(value):
        raise ValueError(f"`{name}` is {value}, but must be finite")
    return float(value)


def _integer(name: str, value: Any) -> int:
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if isinstance(value, numbers.Integral):
            return int(value)
        if math.isfinite(value) and float(value).is_integer():
            return int(value)
    raise TypeError(f"`{name}` is {value!r}, but must be an integer")


def _check_less(lower: Any, upper: Any) -> None:
    if not lower < upper:
        raise ValueError(f"`lower` is {lower}, but must be < `upper` ({upper})")


def _check_base(base: Any) -> float:
    value = _real("base", base)
    if value <= 0 or value == 1:
        raise ValueError(f"`base` is {base}, but must be > 0 and != 1")
    return value


def _float_multiples(lower: float, upper: float, q: float) -> tuple[int, int]:
    """First and last k with k * q inside [lower, upper], tolerant of float rounding."""
    lo, hi = lower / q, upper / q
    k_lo = math.ceil(lo - _Q_TOLERANCE * max(1.0, abs(lo)))
    k_hi = math.floor(hi + _Q_TOLERANCE * max(1.0, abs(hi)))
    if k_lo > k_hi:
        raise ValueError(
            f"`q` is {q}, but no multiple of it lies between "
            f"`lower` ({lower}) and `upper` ({upper})"
        )
    return k_lo, k_hi


def _int_multiples(lower: int, upper: int, q: int) -> tuple[int, int]:
    k_lo, k_hi = -(-lower // q), upper // q
    if k_lo > k_hi:
        raise ValueError(
            f"`q` is {q}, but no multiple of it lies between "
            f"`lower` ({lower}) and `upper` ({upper})"
        )
    return k_lo, k_hi


def _round_index(x: float, q: float, k_lo: int, k_hi: int) -> int:
    """Ray's ``np.round(x / q)``, clipped to the multiples inside the bounds."""
    return min(max(int(np.round(x / q)), k_lo), k_hi)


def _log_sample(rng: np.random.Generator, lower: float, upper: float, base: float) -> float:
    log_base = math.log(base)
    exponent = rng.uniform(math.log(lower) / log_base, math.log(upper) / log_base)
    return float(base**exponent)


def _clip(x: float, lower: float, upper: float) -> float:
    return min(max(x, lower), upper)


# -- float domains --------------------------------------------------------------
@dataclass(frozen=True)
class Uniform(Domain):
    """Floats uniform in ``[lower, upper)``; see :func:`uniform`."""

    lower: float
    upper: float

    def __post_init__(self) -> None:
        lower, upper = _real("lower", self.lower), _real("upper", self.upper)
        _check_less(self.lower, self.upper)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)

    def sample(self, rng: np.random.Generator) -> float:
        return _clip(float(rng.uniform(self.lower, self.upper)), self.lower, self.upper)


@dataclass(frozen=True)
class QUniform(Domain):
    """Uniform floats rounded to a multiple of ``q``, within ``[lower, upper]``."""

    lower: float
    upper: float
    q: float
    _k_range: tuple[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lower, upper, q = _real("lower", self.lower), _real("upper", self.upper), _real("q", self.q)
        _check_less(self.lower, self.upper)
        check_positive("q", self.q)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "q", q)
        object.__setattr__(self, "_k_range", _float_multiples(lower, upper, q))

    def sample(self, rng: np.random.Generator) -> float:
        k = _round_index(float(rng.uniform(self.lower, self.upper)), self.q, *self._k_range)
        return _clip(k * self.q, self.lower, self.upper)


@dataclass(frozen=True)
class LogUniform(Domain):
    """Floats whose logarithm is uniform, within ``[lower, upper]``."""

    lower: float
    upper: float
    base: float = 10

    def __post_init__(self) -> None:
        lower, upper = _real("lower", self.lower), _real("upper", self.upper)
        check_positive("lower", self.lower)
        _check_less(self.lower, self.upper)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "base", _check_base(self.base))

    def sample(self, rng: np.random.Generator) -> float:
        return _clip(_log_sample(rng, self.lower, self.upper, self.base), self.lower, self.upper)


@dataclass(frozen=True)
class QLogUniform(Domain):
    """Log-uniform floats rounded to a multiple of ``q``, within ``[lower, upper]``."""

    lower: float
    upper: float
    q: float
    base: float = 10
    _k_range: tuple[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lower, upper, q = _real("lower", self.lower), _real("upper", self.upper), _real("q", self.q)
        check_positive("lower", self.lower)
        _check_less(self.lower, self.upper)
        check_positive("q", self.q)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "q", q)
        object.__setattr__(self, "base", _check_base(self.base))
        object.__setattr__(self, "_k_range", _float_multiples(lower, upper, q))

    def sample(self, rng: np.random.Generator) -> float:
        x = _log_sample(rng, self.lower, self.upper, self.base)
        k = _round_index(x, self.q, *self._k_range)
        return _clip(k * self.q, self.lower, self.upper)


@dataclass(frozen=True)
class Normal(Domain):
    """Normally distributed floats; see :func:`randn`."""

    mean: float = 0.0
    sd: float = 1.0

    def __post_init__(self) -> None:
        mean, sd = _real("mean", self.mean), _real("sd", self.sd)
        check_positive("sd", self.sd)
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "sd", sd)

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.normal(self.mean, self.sd))


# -- integer domains ------------------------------------------------------------
@dataclass(frozen=True)
class RandInt(Domain):
    """Integers uniform in ``[lower, upper)`` (``upper`` excluded, as in Ray)."""

    is_integer: ClassVar[bool] = True

    lower: int
    upper: int

    def __post_init__(self) -> None:
        lower, upper = _integer("lower", self.lower), _integer("upper", self.upper)
        _check_less(self.lower, self.upper)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)

    def sample(self, rng: np.random.Generator) -> int:
        return int(rng.integers(self.lower, self.upper))


@dataclass(frozen=True)
class QRandInt(Domain):
    """Integers in ``[lower, upper]`` (both included) rounded to a multiple of ``q``."""

    is_integer: ClassVar[bool] = True

    lower: int
    upper: int
    q: int = 1
    _k_range: tuple[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        lower, upper = _integer("lower", self.lower), _integer("upper", self.upper)
        q = _integer("q", self.q)
        if not lower <= upper:
            raise ValueError(f"`lower` is {self.lower}, but must be <= `upper` ({self.upper})")
        check_positive("q", self.q)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "q", q)
        object.__setattr__(self, "_k_range", _int_multiples(lower, upper, q))

    def sample(self, rng: np.random.Generator) -> int:
        x = int(rng.integers(self.lower, self.upper, endpoint=True))
        return _round_index(x, self.q, *self._k_range) * self.q


@dataclass(frozen=True)
class LogRandInt(Domain):
    """Integers in ``[lower, upper)`` whose logarithm is uniform (floor of a log-uniform)."""

    is_integer: ClassVar[bool] = True

    lower: int
    upper: int
    base: float = 10

    def __post_init__(self) -> None:
        lower, upper = _integer("lower", self.lower), _integer("upper", self.upper)
        check_positive("lower", self.lower)
        _check_less(self.lower, self.upper)
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)
        object.__setattr__(self, "base", _check_base(self.base))

    def sample(self, rng: np.random.Generator) -> int:
        x = math.floor(_log_sample(rng, self.lower, self.upper, self.base))
        return min(max(x, self.lower), self.upper - 1)


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
