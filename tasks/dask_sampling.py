"""Dask's own sampling kept off the global ``random`` stream, in the driver and on workers."""

from __future__ import annotations

import random
import sys
import types


def isolate_dask_sampling() -> None:
    """Give ``dask.sizeof`` a private generator.

    Dask estimates the size of large lists by sampling them with the global
    ``random``, from its own threads, while a segment runs: that shifts the
    stream a seeded trainable draws from and breaks reproducibility (seen on
    this project's benchmark: now and then a seeded segment diverged).
    """
    sizeof = sys.modules.get("dask.sizeof")
    if sizeof is None:
        import dask.sizeof as sizeof
    if isinstance(getattr(sizeof, "random", None), types.ModuleType):
        sizeof.random = random.Random(0)
