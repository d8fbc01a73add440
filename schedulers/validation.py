"""Argument checks shared by the schedulers and search spaces (ValueErrors that name the argument)."""

from __future__ import annotations

from numbers import Real
from typing import Any


def check_mode(mode: str | None) -> None:
    if mode is not None and mode not in ("min", "max"):
        raise ValueError(f"`mode` is {mode!r}, but must be 'min' or 'max'")


def check_positive(name: str, value: Any) -> None:
    """ValueError naming ``name`` unless ``value`` is a real number > 0 (bools are not)."""
    if isinstance(value, bool) or not isinstance(value, Real) or not value > 0:
        raise ValueError(f"`{name}` is {value!r}, but must be > 0")
