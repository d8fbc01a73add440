"""The driver's clock: real time on a cluster, virtual time in a simulation.

The driver reads time to cut asynchronous rounds (``commit_interval``), to wait out a
failed trial's retry backoff, to spend a ``time_budget_s`` and to stamp commits. It reads
it here only, so a simulated backend (:mod:`popflow.flows.backends.simulated`) can run a
whole experiment on a virtual clock and tests need not patch :mod:`time`.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (durations, deadlines)."""
        ...

    def time(self) -> float:
        """Seconds since the epoch (what a commit is stamped with)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` pass."""
        ...


class SystemClock:
    """The process's own clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class VirtualClock:
    """Time that passes only when told: :meth:`sleep` and :meth:`advance_to` move it.

    ``start``: the epoch time it reads at 0 (commits of a simulated run are stamped from
    there, so two simulations of one experiment write the same commits).
    """

    def __init__(self, start: float = 0.0) -> None:
        self.now = 0.0
        self.start = start

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.start + self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)

    def advance_to(self, at: float) -> None:
        """Move to ``at`` (never back)."""
        self.now = max(self.now, at)
