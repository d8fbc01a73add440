"""How transient storage errors are retried: exponential backoff with jitter."""

from __future__ import annotations

import random
from dataclasses import dataclass

#: Attempts :meth:`RetryPolicy.within` allows: its deadline ends the retries first (at
#: most ``max_delay`` apart, a connect timeout each on an object store)
OUTAGE_ATTEMPTS = 10_000


@dataclass(frozen=True)
class RetryPolicy:
    """How transient storage errors are retried: exponential backoff with jitter.

    Retry ``n`` (1-based) waits ``min(max_delay, base_delay * 2**(n-1))``
    scaled by a random factor in [0.5, 1]. At most ``attempts`` calls are
    made, and no retry starts that would begin later than ``deadline``
    seconds after the first call.
    """

    attempts: int = 5
    base_delay: float = 0.25
    max_delay: float = 4.0
    deadline: float = 30.0

    @classmethod
    def within(cls, seconds: float) -> RetryPolicy:
        """Retries for as long as ``seconds`` (a driver's lease: an outage shorter than
        it is ridden out; a longer one ends the driver, which can no longer prove it
        holds the experiment), however many attempts that takes."""
        return cls(attempts=OUTAGE_ATTEMPTS, deadline=seconds)

    def __post_init__(self) -> None:
        if not (isinstance(self.attempts, int) and self.attempts >= 1):
            raise ValueError(f"`attempts` is {self.attempts!r}, but must be an integer >= 1")
        for name in ("base_delay", "max_delay", "deadline"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"`{name}` is {value!r}, but must be >= 0")
        if self.max_delay < self.base_delay:
            raise ValueError(
                f"`max_delay` is {self.max_delay!r}, but must be >= `base_delay` "
                f"({self.base_delay!r})"
            )


def backoff_delay(retry: int, policy: RetryPolicy, rng: random.Random) -> float:
    """Seconds to wait before retry number ``retry`` (1-based) under ``policy``."""
    ceiling = min(policy.max_delay, policy.base_delay * 2.0 ** (retry - 1))
    return ceiling * (0.5 + 0.5 * rng.random())
