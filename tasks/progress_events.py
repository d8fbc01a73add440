"""A running segment's latest result, sent to the driver as it trains (for its console).

A segment's results reach the driver when the segment ends, which for a FIFO
trial or an ASHA trial past its last rung is when the trial ends. So that the
console's table moves meanwhile, a segment given a ``progress_topic`` sends
its latest result's numbers at most every ``PROGRESS_INTERVAL_S`` as a Dask
event (``Worker.log_event``, thread-safe, over the worker's batched stream to
the scheduler). Nothing depends on it arriving: the committed results stay
the truth.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

logger = logging.getLogger(__name__)

#: at most one event per segment in this many seconds (the console redraws every 2 s)
PROGRESS_INTERVAL_S = 2.0


def _numbers(result: dict[str, Any]) -> dict[str, float | int]:
    """The result's top-level finite numbers (what a table row shows), not its bulk."""
    return {
        k: v
        for k, v in result.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


class ProgressSender:
    """Sends ``trial_id``'s latest result on ``topic`` now and then (None: never)."""

    def __init__(self, topic: str | None, trial_id: str) -> None:
        self.topic, self.trial_id = topic, trial_id
        self._worker: Any = None
        self._due = time.monotonic() + PROGRESS_INTERVAL_S
        if topic is not None:
            try:
                from distributed import get_worker

                self._worker = get_worker()
            except ValueError:  # not in a Dask task (a local test run): nobody to tell
                self._worker = None

    def result(self, result: dict[str, Any]) -> None:
        if self._worker is None:
            return
        now = time.monotonic()
        if now < self._due:
            return
        self._due = now + PROGRESS_INTERVAL_S
        try:
            self._worker.log_event(
                self.topic, {"trial_id": self.trial_id, "result": _numbers(result)}
            )
        except Exception as e:  # the console's view only: never the trial's failure
            logger.debug("progress event not sent: %s", e)
            self._worker = None
