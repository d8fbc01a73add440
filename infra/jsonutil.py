"""JSON for results and state: numpy scalars and arrays become plain values, NaN is kept."""

from __future__ import annotations

import json
from typing import Any

import numpy as np


def _default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return repr(obj)  # like Ray's SafeFallbackEncoder: never fail a log line on a value


#: one encoder for the plain case: json.dumps builds a new one per call when given ``default``
_ENCODER = json.JSONEncoder(default=_default)


def dumps(obj: Any, **kwargs: Any) -> str:
    if not kwargs:
        return _ENCODER.encode(obj)
    return json.dumps(obj, default=_default, **kwargs)


def jsonable(obj: Any) -> Any:
    """``obj`` as it reads back from JSON (so state compares equal after a round trip)."""
    return json.loads(dumps(obj))
