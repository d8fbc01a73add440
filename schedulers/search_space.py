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

Bounds follow Ray: ``randint`` and ``lograndint`` exclude ``upper``;
``qrandint`` includes it; quantized domains round to the nearest multiple of
``q`` (``np.round(x / q) * q``). popflow also keeps quantized samples inside
``[lower, upper]``: if a bound is not a multiple of ``q``, samples snap to the
multiples of ``q`` that lie inside the bounds.
"""

from __future__ import annotations

import copy
import inspect
import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from popflow.schedulers.validation import check_positive

GRID_SEARCH_KEY = "grid_search"

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


def randint(lower: int, upper: int) -> RandInt:
    """Integer uniform in ``[lower, upper)``: ``upper`` is excluded, as in Ray.

    >>> import numpy as np
    >>> randint(0, 3).sample(np.random.default_rng(0)) in (0, 1, 2)
    True
    """
    return RandInt(lower, upper)


def qrandint(lower: int, upper: int, q: int = 1) -> QRandInt:
    """Integer in ``[lower, upper]`` (``upper`` included, as in Ray), rounded to a multiple of q.

    >>> import numpy as np
    >>> qrandint(0, 100, 25).sample(np.random.default_rng(0)) in (0, 25, 50, 75, 100)
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
    too. Use :func:`choice` or a numeric domain for random values: a function
    that draws from global random state is not reproducible from the seed.

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
