"""Numbers as the console shows them to people: one home for every layer's lines.

Budgets, milestones, hyperparameters and metrics print with 4 significant digits
(Ray's tables round the same way); the stored values keep every digit.
"""

from __future__ import annotations

import math
from typing import Any

#: significant digits of a float on the console
DIGITS = 4


def human(value: Any) -> str:
    """``value`` for a person: floats to :data:`DIGITS` significant digits, whole floats
    as integers, anything else as ``str`` (None as "").

    >>> human(3.3333333333333335), human(10.0), human(0.0030392814666), human(-2.9597458)
    ('3.333', '10', '0.003039', '-2.96')
    >>> human(202.29), human(123456.7), human(7), human(True), human(None), human(math.inf)
    ('202.3', '1.235e+05', '7', 'True', '', 'inf')
    """
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int) or not math.isfinite(value):
        return str(value)
    if value.is_integer() and abs(value) < 10**DIGITS:
        return str(int(value))
    return f"{value:.{DIGITS}g}"
