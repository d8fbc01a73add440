"""What keeps one trial from taking the run down, on the driver's side.

- :func:`result_problem`: a metric or time value that is not a number would
  fail inside the scheduler; it becomes its trial's error, naming both.
- :class:`Retries`: a failed trial's retries back off exponentially, and a
  repeated error is logged once.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Callable
from typing import Any

from popflow.flows.driver.clock import Clock, SystemClock
from popflow.tasks.specs import SegmentOutcome

logger = logging.getLogger(__name__)

#: Retries of a failed trial back off: RETRY_BASE_S * 2**(n-1) seconds, at most RETRY_MAX_S.
RETRY_BASE_S = 0.25
RETRY_MAX_S = 30.0


def raise_storage_failure(outcome: SegmentOutcome) -> None:
    """A worker's storage failed for good (a full disk, a permission): the run stops with
    that StorageError, resumable from its last commit once the cause is fixed. A worker
    whose publish found a newer driver's lease: the run stops with ``LeaseLost``."""
    if outcome.fenced is not None:  # a newer driver holds the lease: stop, delete nothing
        logger.error("trial %s: %s", outcome.trial_id, outcome.fenced)
        raise outcome.fenced
    if outcome.storage_failure is not None:
        logger.error(
            "trial %s: storage failed on worker %s; the run stops (fix the cause, then resume): %s",
            outcome.trial_id,
            outcome.worker or "?",
            outcome.storage_failure,
        )
        raise outcome.storage_failure


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real)


def result_problem(
    trial_id: str, results: list[dict[str, Any]], keys: list[str], scheduler: str
) -> str | None:
    """Why ``scheduler`` cannot use ``results`` (a value of ``keys`` that is no number)."""
    for result in results:
        for key in keys:
            value = result.get(key)
            if key in result and not _is_number(value):
                return (
                    f"trial {trial_id} reported {key!r} = {value!r} ({type(value).__name__}) "
                    f"at iteration {result.get('training_iteration')}; {scheduler} needs a "
                    "number there"
                )
    return None


class MissingMetric:
    """Says once that the trials' results lack the metric the scheduler decides on."""

    def __init__(self, metric: str | None, scheduler: str) -> None:
        self.metric = metric
        self.scheduler = scheduler
        self._said = False

    def look(self, trial_id: str, results: list[dict[str, Any]]) -> None:
        if self._said or not self.metric:
            return
        for result in results:
            if self.metric not in result:
                self._said = True
                logger.warning(
                    "trial %s reported no %r (its result has %s); %s decides on %r, so it "
                    "cannot stop, pause or exploit on results without it",
                    trial_id,
                    self.metric,
                    sorted(k for k in result if k != "config"),
                    self.scheduler,
                    self.metric,
                )
                return


def retry_delay(failures: int) -> float:
    """Seconds before the retry that follows a trial's ``failures``-th failure."""
    return min(RETRY_MAX_S, RETRY_BASE_S * 2.0 ** (failures - 1))


class Retries:
    """When each failed trial may run again, and which errors were said already."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or SystemClock()
        self._at: dict[str, float] = {}  # trial -> when its retry may start (clock's monotonic)
        self._last_error: dict[str, str] = {}  # trial -> last line of its last error

    def failed(
        self, trial_id: str, failures: int, allowed: int, error: str | None, restore: str | None
    ) -> None:
        """Back the trial off after its ``failures``-th failure (of ``allowed``, -1: any);
        the first time for an error at WARNING, repeats at DEBUG."""
        delay = retry_delay(failures)
        line = ((error or "").strip().splitlines() or ["?"])[-1]
        repeated = self._last_error.get(trial_id) == line
        self._last_error[trial_id] = line
        logger.log(
            logging.DEBUG if repeated else logging.WARNING,
            "trial %s failed (%d/%s: %s); retrying from %s in %.2f s%s",
            trial_id,
            failures,
            "inf" if allowed < 0 else allowed,
            line,
            restore or "the start",
            delay,
            "" if repeated else " (the same error again is logged at DEBUG)",
        )
        self._at[trial_id] = self.clock.monotonic() + delay

    def succeeded(self, trial_id: str) -> None:
        self._at.pop(trial_id, None)
        self._last_error.pop(trial_id, None)

    def ready(self, trial_id: str) -> bool:
        return self._at.get(trial_id, 0.0) <= self.clock.monotonic()

    def waiting(self, pending: Callable[[str], bool]) -> list[float]:
        """When the trials that are still ``pending`` may retry."""
        return [at for tid, at in self._at.items() if pending(tid)]
