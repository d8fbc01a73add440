"""Segments that run far longer than their peers, watched while the driver waits.

A segment running far longer than its peers is warned about; past
``segment_timeout_s`` its worker process is restarted and its trial errors.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

#: A segment running this long (and HANG_WARN_FACTOR times the average) is warned about.
HANG_WARN_S = 60.0
HANG_WARN_FACTOR = 20.0


class SegmentWatch:
    """Looks at the runner calls in flight while the driver waits for results."""

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s
        self._warned: set[int] = set()
        self._timed_out: dict[int, float] = {}  # call -> seconds it had run

    def look(
        self,
        started: dict[int, float],
        trials_of: Callable[[int], str],
        worker_of: Callable[[int], str | None],
        typical_s: float | None,
        restart: Callable[[str], None],
    ) -> None:
        """``typical_s``: the segments' moving average (None: none has returned yet)."""
        now = time.monotonic()
        warn_after = max(HANG_WARN_S, HANG_WARN_FACTOR * (typical_s or 0.0))
        for call, since in list(started.items()):
            elapsed = now - since
            worker = worker_of(call)
            if elapsed > warn_after and call not in self._warned:
                self._warned.add(call)
                # before any segment returned there is no average to compare with (a
                # function that reports for ever never ends its first segment)
                peers = (
                    "no segment has returned yet"
                    if typical_s is None
                    else f"segments take {typical_s:.1f} s on average"
                )
                logger.warning(
                    "trial %s: its segment has run for %.0f s on worker %s (%s); a step that "
                    "never returns holds its slot%s",
                    trials_of(call),
                    elapsed,
                    worker,
                    peers,
                    "" if self.timeout_s else " (segment_timeout_s errors such trials)",
                )
            timeout = self.timeout_s
            if timeout and elapsed > timeout and call not in self._timed_out and worker:
                self._timed_out[call] = elapsed
                logger.error(
                    "trial %s: segment ran past segment_timeout_s=%s; restarting worker %s",
                    trials_of(call),
                    timeout,
                    worker,
                )
                restart(worker)

    def returned(self, call: int) -> str | None:
        """The error of a call that timed out (None: it did not)."""
        self._warned.discard(call)
        ran = self._timed_out.pop(call, None)
        if ran is None:
            return None
        return (
            f"its segment ran past segment_timeout_s={self.timeout_s} ({ran:.0f} s); its "
            "worker was restarted"
        )
