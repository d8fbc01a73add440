"""Ray's auto-filled result fields, shared by the class and the function API."""

from __future__ import annotations

import datetime
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Fields that describe the run's timing and process history (wall times,
#: host, restarts), not the training: they differ between identical seeded runs.
VOLATILE_FIELDS = frozenset(
    {
        "time_this_iter_s",
        "time_total_s",
        "time_since_restore",
        "iterations_since_restore",
        "timestamp",
        "date",
        "pid",
        "hostname",
    }
)


@dataclass
class ProgressClock:
    """Counts iterations and time across segments (restored from a checkpoint's metadata)."""

    trial_id: str
    iteration: int = 0
    time_total_s: float = 0.0
    iterations_since_restore: int = 0
    time_since_restore: float = 0.0
    _last: float = field(default_factory=time.perf_counter)

    @classmethod
    def restored(cls, trial_id: str, metadata: dict[str, Any] | None) -> ProgressClock:
        meta = metadata or {}
        return cls(
            trial_id=trial_id,
            iteration=int(meta.get("iteration", 0)),
            time_total_s=float(meta.get("time_total_s", 0.0)),
        )

    def start(self) -> None:
        self._last = time.perf_counter()

    def fill(
        self, metrics: dict[str, Any], seconds: Callable[[dict[str, Any]], float] | None = None
    ) -> dict[str, Any]:
        """A copy of ``metrics`` with the auto fields of the iteration that just ended;
        ``seconds``: what it took, from its metrics (a simulation's virtual clock)."""
        now = time.perf_counter()
        elapsed = now - self._last
        self._last = now
        reported = metrics.get("time_this_iter_s")
        if seconds is not None:
            elapsed = float(seconds(metrics))
        elif isinstance(reported, int | float) and not isinstance(reported, bool) and reported >= 0:
            elapsed = float(reported)  # as Ray: a trainable may say what its iteration took
        self.iteration += 1
        self.iterations_since_restore += 1
        self.time_total_s += elapsed
        self.time_since_restore += elapsed
        result = dict(metrics)
        result.setdefault("done", False)
        result.update(
            training_iteration=self.iteration,
            time_this_iter_s=elapsed,
            time_total_s=self.time_total_s,
            time_since_restore=self.time_since_restore,
            iterations_since_restore=self.iterations_since_restore,
            timestamp=int(time.time()),
            date=datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S"),
            trial_id=self.trial_id,
            pid=os.getpid(),
            hostname=socket.gethostname(),
        )
        return result

    def metadata(self) -> dict[str, Any]:
        """What a checkpoint records so a restored trial counts on from here."""
        return {"iteration": self.iteration, "time_total_s": self.time_total_s}


def comparable(result: dict[str, Any]) -> dict[str, Any]:
    """A result without the fields that differ between identical seeded runs."""
    return {k: v for k, v in result.items() if k not in VOLATILE_FIELDS}
