"""One way to wait in a test: poll a condition until it holds, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    condition: Callable[[], T], timeout_s: float = 120.0, what: str = "condition",
    interval_s: float = 0.05,
) -> T:  # fmt: skip
    """Poll ``condition()`` until it returns something truthy and return that value;
    fail with an ``AssertionError`` naming ``what`` after ``timeout_s`` seconds.

    Polling with a deadline, not sleeping for a fixed time: the test goes on the moment
    the condition holds, and a slow machine only makes it wait longer.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not after {timeout_s:.0f} s")
        time.sleep(interval_s)
