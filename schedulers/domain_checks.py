"""Argument checks and sampling arithmetic shared by the domains (:mod:`popflow.schedulers.domains`).

Quantization follows Ray 2.60's ``Quantized`` sampler: the bounds are snapped inwards
to the grid of multiples of ``q`` (a bound within float rounding of a multiple counts
as that multiple), and a value is rounded to the nearest multiple (``np.round``).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

# Relative slack for "is this bound a multiple of q" under float rounding (Ray's isclose).
_Q_TOLERANCE = 1e-9


def real(name: str, value: Any) -> float:
    """``value`` as a finite float; TypeError/ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"`{name}` is {value!r}, but must be a real number")
    if not math.isfinite(value):
        raise ValueError(f"`{name}` is {value}, but must be finite")
    return float(value)


def integer(name: str, value: Any) -> int:
    """``value`` as an int (a whole float counts); TypeError naming ``name`` otherwise."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if isinstance(value, numbers.Integral):
            return int(value)
        if math.isfinite(value) and float(value).is_integer():
            return int(value)
    raise TypeError(f"`{name}` is {value!r}, but must be an integer")


def check_less(lower: Any, upper: Any) -> None:
    if not lower < upper:
        raise ValueError(f"`lower` is {lower}, but must be < `upper` ({upper})")


def check_base(base: Any) -> float:
    value = real("base", base)
    if value <= 0 or value == 1:
        raise ValueError(f"`base` is {base}, but must be > 0 and != 1")
    return value


def _no_multiple(lower: Any, upper: Any, q: Any) -> ValueError:
    return ValueError(
        f"`q` is {q}, but no multiple of it lies between `lower` ({lower}) and `upper` ({upper})"
    )


def float_multiples(lower: float, upper: float, q: float) -> tuple[int, int]:
    """First and last k with k * q inside [lower, upper], tolerant of float rounding."""
    lo, hi = lower / q, upper / q
    k_lo = math.ceil(lo - _Q_TOLERANCE * max(1.0, abs(lo)))
    k_hi = math.floor(hi + _Q_TOLERANCE * max(1.0, abs(hi)))
    if k_lo > k_hi:
        raise _no_multiple(lower, upper, q)
    return k_lo, k_hi


def int_multiples(lower: int, upper: int, q: int, *, upper_excluded: bool) -> tuple[int, int]:
    """First and last k with k * q in [lower, upper] (``upper`` excluded if asked)."""
    k_lo, k_hi = -(-lower // q), upper // q - (1 if upper_excluded else 0)
    if k_lo > k_hi:
        if upper_excluded and q == 1:
            raise ValueError(
                f"`lower` is {lower}, but must be < `upper` ({upper}): with q=1 `upper` "
                "is excluded, as in Ray"
            )
        raise _no_multiple(lower, upper, q)
    return k_lo, k_hi


def round_index(x: float, q: float, k_lo: float, k_hi: float) -> int:
    """Ray's ``np.round(x / q)``, clipped to the multiples inside the bounds."""
    return int(min(max(np.round(x / q), k_lo), k_hi))


def log_sample(rng: np.random.Generator, lower: float, upper: float, base: float) -> float:
    """A float in [lower, upper] whose logarithm is uniform."""
    log_base = math.log(base)
    exponent = rng.uniform(math.log(lower) / log_base, math.log(upper) / log_base)
    return float(base**exponent)


def clip(x: float, lower: float, upper: float) -> float:
    return min(max(x, lower), upper)
