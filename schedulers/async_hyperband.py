"""Asynchronous Successive Halving (ASHA), Ray Tune's ``AsyncHyperBandScheduler``.

Li et al., "A System for Massively Parallel Hyperparameter Tuning" (2018),
https://arxiv.org/abs/1810.05934.

Each bracket ``s`` (``0 <= s < brackets``) has rungs at ``r * η**(k + s)`` for
``k = 0, 1, ...`` while the rung stays within ``R``, where ``r`` is the minimum
resource (``grace_period``), ``R`` the maximum (``max_t``) and ``η`` the
reduction factor. When a trial's ``time_attr`` first passes a rung it has no
score recorded at, its score is compared with the ``1 - 1/η`` quantile of the
scores recorded at that rung: below the cutoff it stops, otherwise it goes on.
Either way its score is recorded there. Decisions are per result, so no trial
ever waits for another (unlike synchronous HyperBand).

Example:
    >>> from popflow.schedulers import ASHAScheduler, Trial
    >>> import numpy as np
    >>> asha = ASHAScheduler(metric="acc", mode="max", max_t=16, grace_period=1,
    ...                      reduction_factor=2, rng=np.random.default_rng(0))
    >>> asha.milestones(0)
    [1, 2, 4, 8, 16]
    >>> a, b = Trial("a", {}), Trial("b", {})
    >>> asha.on_trial_add(a); asha.on_trial_add(b)
    >>> str(asha.on_trial_result(a, {"training_iteration": 1, "acc": 0.9}))
    'CONTINUE'
    >>> str(asha.on_trial_result(b, {"training_iteration": 1, "acc": 0.1}))
    'STOP'
    >>> asha.next_milestone(a)
    2
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from numbers import Real
from typing import Any

import numpy as np

from popflow.schedulers.rounding import human
from popflow.schedulers.trial import Trial
from popflow.schedulers.trial_scheduler import Action, TrialScheduler, score
from popflow.schedulers.validation import (
    MAX_RUNGS,
    check_bool,
    check_finite_positive,
    check_rung_count,
)

logger = logging.getLogger(__name__)

__all__ = ["ASHAScheduler", "AsyncHyperBandScheduler"]


def rung_milestones(min_t: float, max_t: float, reduction_factor: float, s: int) -> list[float]:
    """Rung milestones of ASHA bracket ``s``, largest first (Ray's order).

    ``r * η**(k + s)`` for ``k`` in ``range(int(log(R / r) / log(η) - s + 1))``;
    empty when the bracket has no rung within ``R``.

    >>> rung_milestones(1, 100, 4, 0)
    [64, 16, 4, 1]
    >>> rung_milestones(1, 100, 4, 1)
    [64, 16, 4]
    """
    num_rungs = int(np.log(max_t / min_t) / np.log(reduction_factor) - s + 1)
    return [min_t * reduction_factor ** (k + s) for k in reversed(range(num_rungs))]


def check_bracket_count(brackets: int, max_t: float, min_t: float, reduction_factor: float) -> None:
    """ValueError unless ``1 <= brackets <= MAX_RUNGS``; a warning when some have no rungs.

    Bracket ``s`` has ``int(log_η(R / r)) - s + 1`` rungs: past the first ``n_0`` brackets
    each is empty, identical to the others, and only takes a share of the trials (Ray's
    softmax gives it weight ``e**-n_0``), which it never stops early. Ray builds every
    bracket (``brackets=10**9`` never ends); popflow allows as many as a plan may have rungs.
    """
    with_rungs = len(rung_milestones(min_t, max_t, reduction_factor, 0))
    if not 1 <= brackets <= MAX_RUNGS:
        raise ValueError(
            f"`brackets` is {brackets!r}, but must be between 1 and {MAX_RUNGS:,} "
            f"(with max_t={max_t!r}, grace_period={min_t!r}, reduction_factor="
            f"{reduction_factor!r} only the first {with_rungs} have rungs; the others are "
            "all alike, brackets whose trials are never stopped early)"
        )
    if brackets > with_rungs:
        logger.warning(
            "ASHA: brackets=%d, but only %d have rungs with max_t=%r, grace_period=%r, "
            "reduction_factor=%r: the trials in the other %d are never stopped early (as in Ray)",
            brackets,
            with_rungs,
            max_t,
            min_t,
            reduction_factor,
            brackets - with_rungs,
        )


def rung_cutoff(scores: list[float], reduction_factor: float) -> float | None:
    """The ``1 - 1/η`` quantile of a rung's recorded scores (NaN ignored).

    None when nothing is recorded; NaN when only NaN is recorded (a NaN cutoff
    stops nobody, as in Ray).
    """
    if not scores:
        return None
    if all(math.isnan(x) for x in scores):
        return math.nan
    return float(np.nanpercentile(scores, (1 - 1 / reduction_factor) * 100))


class _Bracket:
    """One ASHA bracket: rungs (largest milestone first) and their recorded scores."""

    def __init__(self, milestones: list[float], reduction_factor: float, stop_last_trials: bool):
        self.reduction_factor = reduction_factor
        self.stop_last_trials = stop_last_trials
        self.rungs: list[tuple[float, dict[str, float]]] = [(m, {}) for m in milestones]
        self.num_stopped = 0

    def on_result(self, trial_id: str, cur_t: float, cur_score: float) -> Action:
        """Ray's ``_Bracket.on_result``: decide at the highest passed rung not yet recorded."""
        action = Action.CONTINUE
        for milestone, recorded in self.rungs:
            if cur_t >= milestone and trial_id in recorded and not self.stop_last_trials:
                # Already promoted past this rung: the decision was made then.
                break
            if cur_t < milestone or trial_id in recorded:
                continue
            cutoff = rung_cutoff(list(recorded.values()), self.reduction_factor)
            if cutoff is not None and cur_score < cutoff:
                action = Action.STOP
            recorded[trial_id] = cur_score
            break
        return action

    def debug_str(self, s: int) -> str:
        rungs = " | ".join(
            f"Iter {float(m):.3f}: {_cutoff(rung_cutoff(list(rec.values()), self.reduction_factor))}"
            for m, rec in self.rungs
        )
        return f"Bracket s={s}: num_stopped={self.num_stopped} | {rungs}"


class AsyncHyperBandScheduler(TrialScheduler):
    """Ray Tune's ``AsyncHyperBandScheduler`` (ASHA), same arguments and defaults.

    Args:
        time_attr: monotonically increasing result key measuring resources (``r``, ``R``).
        metric, mode: objective and direction ("min" or "max"); may instead be
            given to ``run(metric=..., mode=...)``.
        max_t: ``R``, the maximum time per trial; a result at or past it stops
            the trial when ``stop_last_trials``.
        grace_period: ``r``, the first rung; no trial is stopped before it.
        reduction_factor: ``η``; the top ``1/η`` of each rung goes on.
        brackets: number of brackets ``s = 0 .. brackets-1``; bracket ``s``
            starts its rungs at ``r * η**s``.
        stop_last_trials: stop trials at ``max_t`` (else they run on, unchecked).
        rng: generator for bracket assignment (``popflow.run`` injects the seeded one).
    """

    def __init__(
        self,
        time_attr: str = "training_iteration",
        metric: str | None = None,
        mode: str | None = None,
        max_t: float = 100,
        grace_period: float = 1,
        reduction_factor: float = 4,
        brackets: int = 1,
        stop_last_trials: bool = True,
        *,
        rng: np.random.Generator | None = None,
    ) -> None:
        check_finite_positive("max_t", max_t)
        check_finite_positive("grace_period", grace_period)
        check_bool("stop_last_trials", stop_last_trials)
        if grace_period > max_t:
            raise ValueError(
                f"`grace_period` is {grace_period!r}, but must be <= `max_t` ({max_t!r})"
            )
        if isinstance(reduction_factor, bool) or not isinstance(reduction_factor, Real):
            raise ValueError(
                f"`reduction_factor` is {reduction_factor!r}, but must be a number > 1"
            )
        if not reduction_factor > 1:
            raise ValueError(f"`reduction_factor` is {reduction_factor!r}, but must be > 1")
        check_rung_count(reduction_factor, max_t, grace_period)
        if isinstance(brackets, bool) or not isinstance(brackets, int):
            raise ValueError(
                f"`brackets` is {brackets!r}, but must be an integer between 1 and {MAX_RUNGS:,}"
            )
        check_bracket_count(brackets, max_t, grace_period, reduction_factor)
        super().__init__(metric=metric, mode=mode, rng=rng)
        self.time_attr = time_attr
        self._max_t = max_t
        self._grace_period = grace_period
        self._reduction_factor = reduction_factor
        self._stop_last_trials = stop_last_trials
        self._brackets = [
            _Bracket(
                rung_milestones(grace_period, max_t, reduction_factor, s),
                reduction_factor,
                stop_last_trials,
            )
            for s in range(brackets)
        ]
        self._trial_bracket: dict[str, int] = {}
        self._last_time: dict[str, float] = {}
        self._num_stopped = 0

    # -- introspection -------------------------------------------------------
    def milestones(self, bracket: int) -> list[float]:
        """Rung milestones of a bracket, smallest first."""
        return sorted(m for m, _ in self._brackets[bracket].rungs)

    def bracket_of(self, trial: Trial) -> int | None:
        """Index ``s`` of the bracket the trial was assigned to (None if unknown)."""
        return self._trial_bracket.get(trial.trial_id)

    # -- hooks ---------------------------------------------------------------
    def on_trial_add(self, trial: Trial) -> None:
        if not self._metric or not self._mode:
            raise ValueError(
                f"{type(self).__name__} has no `metric` ({self._metric!r}) or `mode` "
                f"({self._mode!r}): set them on the scheduler, e.g. "
                f"{type(self).__name__}(metric=..., mode=...), or in "
                f"`run(metric=..., mode=...)`"
            )
        if trial.trial_id in self._trial_bracket:  # re-added on resume: keep its bracket
            return
        # Ray's softmax over the brackets' rung counts: fewer rungs, less likely.
        sizes = np.array([len(b.rungs) for b in self._brackets])
        probs = np.e ** (sizes - sizes.max())
        normalized = probs / probs.sum()
        idx = int(self._rng.choice(len(self._brackets), p=normalized))
        self._trial_bracket[trial.trial_id] = idx
        logger.debug("trial %s assigned to bracket s=%d", trial.trial_id, idx)

    def _parse(self, result: Mapping[str, Any]) -> tuple[float, float] | None:
        """(time, score) of a result; None if it lacks time_attr or metric (Ray: skip it)."""
        metric, mode = self._metric, self._mode
        if not metric or not mode:
            return None
        if result.get(self.time_attr) is None or result.get(metric) is None:
            return None
        t = result[self.time_attr]
        return (t.item() if isinstance(t, np.generic) else t), score(result, metric, mode)

    def on_trial_result(self, trial: Trial, result: dict[str, Any]) -> Action:
        parsed = self._parse(result)
        if parsed is None:
            return Action.CONTINUE
        t, cur_score = parsed
        idx = self._trial_bracket.get(trial.trial_id)
        if idx is None:
            raise KeyError(f"trial {trial.trial_id!r} was never added or has already completed")
        self._last_time[trial.trial_id] = t
        bracket = self._brackets[idx]
        if t >= self._max_t and self._stop_last_trials:
            action = Action.STOP
        else:
            action = bracket.on_result(trial.trial_id, t, cur_score)
        if action == Action.STOP:
            self._num_stopped += 1
            bracket.num_stopped += 1
            logger.debug("ASHA stops %s at %s=%s", trial.trial_id, self.time_attr, t)
        return action

    def on_trial_complete(self, trial: Trial, result: dict[str, Any]) -> None:
        parsed = self._parse(result)
        idx = self._trial_bracket.pop(trial.trial_id, None)
        self._last_time.pop(trial.trial_id, None)
        if parsed is not None and idx is not None:
            self._brackets[idx].on_result(trial.trial_id, *parsed)

    def on_trial_remove(self, trial: Trial) -> None:
        self._trial_bracket.pop(trial.trial_id, None)
        self._last_time.pop(trial.trial_id, None)

    def next_milestone(self, trial: Trial) -> float | None:
        """The smallest rung of the trial's bracket above its current time, else ``max_t``.

        None once the trial is at or past ``max_t`` and ``stop_last_trials`` is False.
        """
        t = self._last_time.get(trial.trial_id)
        last = trial.last_result.get(self.time_attr)
        if last is not None and (t is None or last > t):
            t = last
        if t is not None and t >= self._max_t:
            return None if not self._stop_last_trials else self._max_t
        idx = self._trial_bracket.get(trial.trial_id)
        rungs = self._brackets[idx].rungs if idx is not None else []
        ahead = [m for m, _ in rungs if t is None or m > t]
        return min([*ahead, self._max_t])

    # -- persistence ---------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        state.update(
            {
                "num_stopped": self._num_stopped,
                "trial_bracket": dict(self._trial_bracket),
                "last_time": dict(self._last_time),
                "brackets": [
                    {
                        "num_stopped": b.num_stopped,
                        "rungs": [[m, dict(rec)] for m, rec in b.rungs],
                    }
                    for b in self._brackets
                ],
            }
        )
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        brackets = state["brackets"]
        if len(brackets) != len(self._brackets) or any(
            [m for m, _ in saved["rungs"]] != [m for m, _ in b.rungs]
            for saved, b in zip(brackets, self._brackets, strict=True)
        ):
            raise ValueError(
                "saved ASHA state has different brackets/rungs than this scheduler: "
                "construct it with the same max_t, grace_period, reduction_factor, brackets"
            )
        super().set_state(state)
        self._num_stopped = int(state["num_stopped"])
        self._trial_bracket = {k: int(v) for k, v in state["trial_bracket"].items()}
        self._last_time = dict(state["last_time"])
        for saved, b in zip(brackets, self._brackets, strict=True):
            b.num_stopped = int(saved["num_stopped"])
            b.rungs = [(m, {k: float(v) for k, v in rec.items()}) for m, rec in saved["rungs"]]

    def debug_string(self) -> str:
        lines = [f"Using AsyncHyperBand: num_stopped={self._num_stopped}"]
        lines += [b.debug_str(s) for s, b in enumerate(self._brackets)]
        return "\n".join(lines)


ASHAScheduler = AsyncHyperBandScheduler


def _cutoff(value: float | None) -> str:
    """A rung's cutoff as Ray's debug string says it, rounded for people."""
    return "None" if value is None else human(value)
