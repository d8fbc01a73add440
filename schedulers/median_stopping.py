"""The median stopping rule (Golovin et al., "Google Vizier", KDD 2017), as Ray Tune's.

Golovin et al., "Google Vizier: A Service for Black-Box Optimization" (KDD 2017),
https://dl.acm.org/doi/10.1145/3097983.3098043.

A trial is stopped at time ``t`` (``t >= grace_period``) when its best score so far
is strictly worse than the median of the finite running means of the other trials
that have reached ``t`` (last recorded time ``>= t``): a trial's running mean is
the mean of its scores with ``grace_period <= time <= t``, and is left out when
that window is empty or the mean is NaN or +-inf. With fewer than
``min_samples_required`` finite running means there is no verdict; the trial
instead yields (PAUSE) if other trials are waiting to run and it ran more than
``min_time_slice`` since it last yielded.

Example:
    >>> from popflow.schedulers import MedianStoppingRule, Trial
    >>> rule = MedianStoppingRule(time_attr="training_iteration", metric="acc", mode="max",
    ...                           grace_period=1, min_samples_required=1)
    >>> good, bad = Trial("good", {}), Trial("bad", {})
    >>> rule.on_trial_add(good); rule.on_trial_add(bad)
    >>> for i in range(1, 4):
    ...     _ = rule.on_trial_result(good, {"training_iteration": i, "acc": 0.9})
    >>> str(rule.on_trial_result(bad, {"training_iteration": 1, "acc": 0.5}))
    'STOP'

Differences from Ray 2.60 (only with NaN scores, results without
``time_attr``/``metric``, or results of a hard-stopped trial):
    - Running means ignore NaN scores: a window holding NaN and other scores
      has the mean of the others, which counts toward the median; Ray's mean
      of it is NaN, so Ray leaves that trial out. (A window of NaN only is
      left out by both.) Best scores ignore NaN too, and a trial whose results
      are all NaN has best score -inf (+inf for mode=min), so any median
      stops it; Ray's builtin ``max``/``min`` over NaN depend on order, and a
      NaN best score is always stopped.
    - Results lacking ``time_attr`` or ``metric`` (or with None) are skipped
      entirely, also in ``on_trial_complete`` (Ray raises there, or on a later
      decision).
    - A result of a trial this rule hard-stopped gets STOP again; Ray fails an
      assertion.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from numbers import Real
from typing import Any

import numpy as np

from popflow.schedulers.trial import Trial, TrialStatus
from popflow.schedulers.trial_scheduler import Action, TrialScheduler, score
from popflow.schedulers.validation import check_bool

logger = logging.getLogger(__name__)

__all__ = ["MedianStoppingRule", "running_mean"]


def running_mean(history: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Mean of the non-NaN scores with ``start <= time <= end`` (NaN if there are none).

    May be +-inf, or NaN for +inf and -inf together; the rule leaves such means out.

    >>> running_mean([(0, 9.0), (1, 1.0), (2, float("nan")), (3, 3.0), (4, 7.0)], 1, 3)
    2.0
    """
    window = [x for t, x in history if start <= t <= end and not math.isnan(x)]
    if not window:
        return math.nan
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, overflow: left out
        return float(np.mean(window))


class MedianStoppingRule(TrialScheduler):
    """Ray Tune's ``MedianStoppingRule``, same arguments and defaults.

    Args:
        time_attr: monotonically increasing result key measuring time ``t``.
        metric, mode: objective and direction; may instead be given to ``popflow.run``.
        grace_period: no verdict before this time; running means start here.
        min_samples_required: other trials at ``t`` needed for a verdict.
        min_time_slice: with too few samples, a trial yields (PAUSE) to waiting
            trials at most once per this much time.
        hard_stop: STOP a trial below the median; if False, PAUSE it instead, and
            from then on let it run unchecked when resumed (Ray's FIFO fallback).
        rng: unused (no randomness), accepted for a uniform constructor.

    ``next_milestone(trial)`` is ``max(grace_period, t_last + min_time_slice)``,
    ``t_last`` being the time of the trial's last result at or after
    ``grace_period`` (``grace_period`` before that): the rule needs the trial's
    result at ``grace_period`` and then at least every ``min_time_slice``. When
    this equals the trial's current time (always, with the default
    ``min_time_slice=0``) the next result is the next decision point, so the
    controller should run one reporting step. None for a trial this rule
    stopped or soft-stopped (no more checks).
    """

    def __init__(
        self,
        time_attr: str = "time_total_s",
        metric: str | None = None,
        mode: str | None = None,
        grace_period: float = 60.0,
        min_samples_required: int = 3,
        min_time_slice: float = 0,
        hard_stop: bool = True,
        *,
        rng: np.random.Generator | None = None,
    ) -> None:
        if (
            isinstance(grace_period, bool)
            or not isinstance(grace_period, Real)
            or not grace_period >= 0
        ):
            raise ValueError(f"`grace_period` is {grace_period!r}, but must be >= 0")
        if (
            isinstance(min_samples_required, bool)
            or not isinstance(min_samples_required, int)
            or min_samples_required < 1
        ):
            raise ValueError(
                f"`min_samples_required` is {min_samples_required!r}, but must be an integer >= 1"
            )
        if (
            isinstance(min_time_slice, bool)
            or not isinstance(min_time_slice, Real)
            or not min_time_slice >= 0
        ):
            raise ValueError(f"`min_time_slice` is {min_time_slice!r}, but must be >= 0")
        check_bool("hard_stop", hard_stop)
        super().__init__(metric=metric, mode=mode, rng=rng)
        self.time_attr = time_attr
        self._grace_period = grace_period
        self._min_samples_required = min_samples_required
        self._min_time_slice = min_time_slice
        self._hard_stop = hard_stop
        # a soft stop pauses the trial, to resume later from its checkpoint; a hard stop
        # ends it, and a yield to waiting trials keeps an unsaved trainable live
        self.needs_checkpoints = not hard_stop
        # (time, score) per trial, score negated for mode=min; insertion-ordered.
        self._results: dict[str, list[tuple[float, float]]] = {}
        self._stopped: list[str] = []
        self._last_pause: dict[str, float] = {}
        self._last_decision: dict[str, float] = {}
        # The controller's Trial objects, read for status only (not persisted).
        self._trials: dict[str, Trial] = {}

    @property
    def num_stopped(self) -> int:
        return len(self._stopped)

    # -- hooks ---------------------------------------------------------------
    def on_trial_add(self, trial: Trial) -> None:
        if not self._metric or not self._mode:
            raise ValueError(
                f"{type(self).__name__} has no `metric` ({self._metric!r}) or `mode` "
                f"({self._mode!r}): set them on the scheduler, e.g. "
                f"{type(self).__name__}(metric=..., mode=...), or in "
                f"`run(metric=..., mode=...)`"
            )
        self._trials[trial.trial_id] = trial

    def _parse(self, result: Mapping[str, Any]) -> tuple[float, float] | None:
        metric, mode = self._metric, self._mode
        if not metric or not mode:
            return None
        if result.get(self.time_attr) is None or result.get(metric) is None:
            return None
        t = result[self.time_attr]
        return (t.item() if isinstance(t, np.generic) else t), score(result, metric, mode)

    def _others_waiting(self, trial_id: str) -> bool:
        return any(
            t.status in (TrialStatus.PENDING, TrialStatus.PAUSED)
            for tid, t in self._trials.items()
            if tid != trial_id
        )

    def on_trial_result(self, trial: Trial, result: dict[str, Any]) -> Action:
        tid = trial.trial_id
        self._trials[tid] = trial
        parsed = self._parse(result)
        if parsed is None:
            return Action.CONTINUE
        if tid in self._stopped:
            return Action.STOP if self._hard_stop else Action.CONTINUE
        t, cur = parsed
        self._results.setdefault(tid, []).append((t, cur))
        if t < self._grace_period:
            return Action.CONTINUE
        self._last_decision[tid] = t

        # Ray's _trials_beyond_time: every other trial whose last result is at or
        # past t; only finite running means count, toward min_samples_required too.
        means = [
            running_mean(hist, self._grace_period, t)
            for o, hist in self._results.items()
            if o != tid and hist[-1][0] >= t
        ]
        finite = [m for m in means if math.isfinite(m)]
        if len(finite) < self._min_samples_required:
            since = t - self._last_pause.get(tid, -math.inf)
            if since > self._min_time_slice and self._others_waiting(tid):
                self._last_pause[tid] = t
                logger.debug("median rule: %s yields at t=%s (%d samples)", tid, t, len(finite))
                return Action.PAUSE
            return Action.CONTINUE

        median = float(np.median(finite))
        scores = [x for _, x in self._results[tid] if not math.isnan(x)]
        best = max(scores) if scores else -math.inf
        if median > best:
            self._stopped.append(tid)
            logger.debug(
                "median rule: stops %s at t=%s (best %s < median %s)", tid, t, best, median
            )
            return Action.STOP if self._hard_stop else Action.PAUSE
        return Action.CONTINUE

    def on_trial_complete(self, trial: Trial, result: dict[str, Any]) -> None:
        self._trials[trial.trial_id] = trial
        parsed = self._parse(result)
        if parsed is not None:
            self._results.setdefault(trial.trial_id, []).append(parsed)

    def choose_trial_to_run(self, trials: Sequence[Trial]) -> Trial | None:
        for trial in trials:
            self._trials[trial.trial_id] = trial
        return super().choose_trial_to_run(trials)

    def next_milestone(self, trial: Trial) -> float | None:
        if trial.trial_id in self._stopped:
            return None
        last = self._last_decision.get(trial.trial_id)
        if last is None:
            return self._grace_period
        return max(self._grace_period, last + self._min_time_slice)

    # -- persistence ---------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        state.update(
            {
                "results": {k: [[t, x] for t, x in v] for k, v in self._results.items()},
                "stopped": list(self._stopped),
                "last_pause": dict(self._last_pause),
                "last_decision": dict(self._last_decision),
            }
        )
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        super().set_state(state)
        self._results = {k: [(t, float(x)) for t, x in v] for k, v in state["results"].items()}
        self._stopped = list(state["stopped"])
        self._last_pause = dict(state["last_pause"])
        self._last_decision = dict(state["last_decision"])

    def debug_string(self) -> str:
        return f"Using MedianStoppingRule: num_stopped={self.num_stopped}."
