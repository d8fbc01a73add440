"""Synchronous HyperBand (Li et al., JMLR 2018, Algorithm 1), Ray Tune's ``HyperBandScheduler``.

Li et al., "Hyperband: A Novel Bandit-Based Approach to Hyperparameter Optimization"
(2016; JMLR 2018), https://arxiv.org/abs/1603.06560.

With maximum resource ``R`` (``max_t``) and reduction factor ``η``, HyperBand runs
brackets ``s = s_max .. 0`` with ``s_max = floor(log_η R)``. Bracket ``s`` starts
``n = ceil((s_max + 1) / (s + 1) * η**s)`` trials at ``r = R * η**-s`` and runs
successive halving: at rung ``i`` its ``n_i = floor(n * η**-i)`` trials are
trained until ``r_i = r * η**i``, then the best ``n_{i+1}`` go on. Trials resume
from their checkpoints, so rung ``i`` costs ``n_i * (r_i - r_{i-1})``.

Example (the paper's table for R=81, η=3):
    >>> for bracket in hyperband_plan(81, 3):
    ...     print([(n, int(r)) for n, r in bracket])
    [(81, 1), (27, 3), (9, 9), (3, 27), (1, 81)]
    [(34, 3), (11, 9), (3, 27), (1, 81)]
    [(15, 9), (5, 27), (1, 81)]
    [(8, 27), (2, 81)]
    [(5, 81)]

Differences from Ray's ``HyperBandScheduler`` (deliberate: we follow the paper):
    - Ray uses ``s_max = round(log_η R)`` and successive sizes ``ceil(n / η)``
      (34, 12, 4, 2 instead of 34, 11, 3, 1), and clips each next milestone to
      ``R`` minus the previous one, so its last rungs fall short of ``R``
      (bracket s=4 ends at 54, not 81).
    - Ray fills the ``s = 0`` bracket (5 trials at R) first; we fill ``s_max``
      first, as in Algorithm 1.
    - Ties at a rung go to the trial added first (Ray: the one added last);
      a NaN or missing score ranks last.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from numbers import Real
from typing import Any, NamedTuple

import numpy as np

from popflow.schedulers.rounding import human
from popflow.schedulers.trial import Trial, TrialStatus
from popflow.schedulers.trial_scheduler import Action, Decision, TrialScheduler, score
from popflow.schedulers.validation import (
    check_bool,
    check_finite_positive,
    check_hyperband_brackets,
    check_rung_count,
)

logger = logging.getLogger(__name__)

__all__ = ["HyperBandScheduler", "Rung", "hyperband_plan"]


class Rung(NamedTuple):
    """One rung of a HyperBand bracket: ``n`` trials trained until time ``r``."""

    n: int
    r: float


def _check_args(max_t: Any, reduction_factor: Any) -> None:
    check_finite_positive("max_t", max_t)
    if (
        isinstance(reduction_factor, bool)
        or not isinstance(reduction_factor, Real)
        or not reduction_factor > 1
    ):
        raise ValueError(f"`reduction_factor` is {reduction_factor!r}, but must be > 1")
    check_rung_count(reduction_factor, max_t)
    check_hyperband_brackets(reduction_factor, max_t)


def hyperband_plan(max_t: float, reduction_factor: float) -> list[list[Rung]]:
    """HyperBand's Algorithm 1 as data: one list of rungs per bracket, ``s = s_max`` first.

    ``R = max_t``, ``η = reduction_factor``, ``s_max = floor(log_η R)`` (0 when
    ``R < η``). Bracket ``s``: ``n = ceil((s_max+1)/(s+1) * η**s)``,
    ``r = R * η**-s``; rung ``i = 0..s``: ``n_i = floor(n * η**-i)``,
    ``r_i = r * η**i`` (so ``r_s = R``). Exact rational arithmetic, no float
    rounding in the floors and ceilings.

    >>> for bracket in hyperband_plan(9, 3):
    ...     print(bracket)
    [Rung(n=9, r=1.0), Rung(n=3, r=3.0), Rung(n=1, r=9.0)]
    [Rung(n=5, r=3.0), Rung(n=1, r=9.0)]
    [Rung(n=3, r=9.0)]
    """
    _check_args(max_t, reduction_factor)
    big_r, eta = Fraction(max_t), Fraction(reduction_factor)
    s_max = 0
    while eta ** (s_max + 1) <= big_r:
        s_max += 1
    plan = []
    for s in range(s_max, -1, -1):
        n = math.ceil(Fraction(s_max + 1, s + 1) * eta**s)
        r = big_r / eta**s
        plan.append([Rung(math.floor(n / eta**i), float(r * eta**i)) for i in range(s + 1)])
    return plan


class _Bracket:
    """Successive halving for one bracket: its members, live cohort and current rung."""

    def __init__(self, s: int, rungs: list[Rung]) -> None:
        self.s = s
        self.rungs = rungs
        self.rung = 0
        self.members: list[str] = []  # in the order added; the tie-break
        self.live: list[str] = []
        self.reported: dict[str, float] = {}  # score at the current rung's milestone
        self.num_stopped = 0

    @property
    def milestone(self) -> float:
        return self.rungs[self.rung].r

    @property
    def is_final(self) -> bool:
        return self.rung == len(self.rungs) - 1

    def accepting(self) -> bool:
        return self.rung == 0 and len(self.members) < self.rungs[0].n

    def cohort_done(self) -> bool:
        return (
            not self.is_final and bool(self.live) and all(tid in self.reported for tid in self.live)
        )

    def leave(self, trial_id: str) -> None:
        if trial_id in self.live:
            self.live.remove(trial_id)
        self.reported.pop(trial_id, None)

    def promote(self) -> dict[str, Action]:
        """Keep the best ``n_{i+1}`` of the cohort, stop the rest; move to rung ``i+1``."""
        order = {tid: k for k, tid in enumerate(self.members)}

        def rank(tid: str) -> tuple[float, int]:
            x = self.reported[tid]
            return (math.inf if math.isnan(x) else -x, order[tid])

        ranked = sorted(self.live, key=rank)
        keep = ranked[: min(self.rungs[self.rung + 1].n, len(ranked))]
        actions = {tid: (Action.CONTINUE if tid in keep else Action.STOP) for tid in self.live}
        self.live = [tid for tid in self.live if tid in keep]
        self.num_stopped += len(actions) - len(keep)
        self.rung += 1
        self.reported = {}
        # a decision: on the console at verbose=3 only (its popflow logger at DEBUG)
        logger.debug(
            "HyperBand bracket s=%d: %d of %d promoted to rung %d (r=%s)",
            self.s,
            len(keep),
            len(actions),
            self.rung,
            human(self.milestone),
        )
        return actions

    def describe(self) -> str:
        n, r = self.rungs[self.rung]
        return (
            f"Bracket(s={self.s}, rung {self.rung}/{len(self.rungs) - 1}: n={n}, r={human(r)}): "
            f"members={len(self.members)} live={len(self.live)} "
            f"reported={len(self.reported)} stopped={self.num_stopped}"
        )


class HyperBandScheduler(TrialScheduler):
    """Ray Tune's ``HyperBandScheduler`` arguments, the paper's brackets.

    Args:
        time_attr: monotonically increasing result key in which ``r`` and ``R`` are measured.
        metric, mode: objective and direction; may instead be given to ``popflow.run``.
        max_t: ``R``, the maximum resource per trial (the final rung of every bracket).
        reduction_factor: ``η``.
        stop_last_trials: stop the survivors at ``R`` (else they run on, unchecked).
        rng: unused (no randomness), accepted for a uniform constructor.

    Controller contract:
        - Add every trial (``on_trial_add``) before feeding results; trials fill
          bracket ``s_max`` until it has ``n`` trials, then ``s_max - 1``, ...,
          then a new band. A bracket only accepts trials before its first halving.
        - Run each trial up to ``next_milestone(trial)`` (its bracket's ``r_i``).
        - ``on_trial_result`` returns PAUSE while the cohort is incomplete. The
          result completing the cohort gets a :class:`Decision` whose ``action``
          is for the reporter and whose ``others`` maps each other cohort member
          to CONTINUE (promoted: resume it) or STOP (stop it).
        - When a trial completes, errors or is removed it leaves its cohort; if
          that completes the cohort, the halving happens then, and
          :meth:`release_paused` (called by the controller after each of those
          hooks) returns the Decision whose ``others`` resume or stop the paused
          members. ``choose_trial_to_run`` never returns a paused trial that
          waits for its cohort or lost.

    Example:
        >>> hb = HyperBandScheduler(metric="acc", mode="max", max_t=9)
        >>> trials = [Trial(f"t{i}", {}) for i in range(9)]
        >>> for t in trials:
        ...     hb.on_trial_add(t)
        >>> hb.next_milestone(trials[0])
        1.0
        >>> out = [hb.on_trial_result(t, {"training_iteration": 1, "acc": i})
        ...        for i, t in enumerate(trials)]
        >>> [str(a) for a in out[:-1]] == ["PAUSE"] * 8
        True
        >>> last = out[-1]  # t8 completes the cohort: top n_1 = 3 go on to r_1 = 3
        >>> str(last.action), sorted(k for k, a in last.others.items() if a == "CONTINUE")
        ('CONTINUE', ['t6', 't7'])
        >>> hb.next_milestone(trials[8])
        3.0
    """

    synchronous = True
    #: a cohort's paused trials leave their slots, then resume from their checkpoints
    needs_checkpoints = True
    #: the brackets' class (HyperBandForBOHB's wait until they are filled)
    _bracket_type: type[_Bracket] = _Bracket

    def __init__(
        self,
        time_attr: str = "training_iteration",
        metric: str | None = None,
        mode: str | None = None,
        max_t: float = 81,
        reduction_factor: float = 3,
        stop_last_trials: bool = True,
        *,
        rng: np.random.Generator | None = None,
    ) -> None:
        _check_args(max_t, reduction_factor)
        super().__init__(metric=metric, mode=mode, rng=rng)
        self.time_attr = time_attr
        self._max_t = max_t
        self._reduction_factor = reduction_factor
        check_bool("stop_last_trials", stop_last_trials)
        self._stop_last_trials = stop_last_trials
        self._plan = hyperband_plan(max_t, reduction_factor)
        self._brackets: list[_Bracket] = []
        self._trial_bracket: dict[str, int] = {}
        self._pending: dict[str, Action] = {}

    # -- introspection -------------------------------------------------------
    @property
    def plan(self) -> list[list[Rung]]:
        """The brackets of one band, ``s = s_max`` first (see :func:`hyperband_plan`)."""
        return [list(b) for b in self._plan]

    def bracket_of(self, trial: Trial) -> int | None:
        """Index of the trial's bracket in order of creation (band after band)."""
        return self._trial_bracket.get(trial.trial_id)

    @property
    def num_stopped(self) -> int:
        """Trials stopped by halving or at ``R``, over all brackets."""
        return sum(b.num_stopped for b in self._brackets)

    def release_paused(self) -> Decision | None:
        """The halving a leaving trial triggered: ``others`` resume or stop its paused cohort.

        ``action`` concerns no trial (CONTINUE). None when no cohort completed.
        """
        if not self._pending:
            return None
        pending, self._pending = self._pending, {}
        return Decision(Action.CONTINUE, others=pending)

    # -- hooks ---------------------------------------------------------------
    def on_trial_add(self, trial: Trial) -> None:
        if not self._metric or not self._mode:
            raise ValueError(
                f"{type(self).__name__} has no `metric` ({self._metric!r}) or `mode` "
                f"({self._mode!r}): set them on the scheduler, e.g. "
                f"{type(self).__name__}(metric=..., mode=...), or in "
                f"`run(metric=..., mode=...)`"
            )
        if trial.trial_id in self._trial_bracket:
            return
        if not self._brackets or not self._brackets[-1].accepting():
            rungs = self._plan[len(self._brackets) % len(self._plan)]
            self._brackets.append(self._bracket_type(len(rungs) - 1, rungs))
        bracket = self._brackets[-1]
        bracket.members.append(trial.trial_id)
        bracket.live.append(trial.trial_id)
        self._trial_bracket[trial.trial_id] = len(self._brackets) - 1

    def _score(self, result: Mapping[str, Any]) -> float:
        metric, mode = self._metric, self._mode
        if not metric or not mode or result.get(metric) is None:
            logger.warning("result without `%s`: ranked last at its rung", metric)
            return math.nan
        return score(result, metric, mode)

    def on_trial_result(self, trial: Trial, result: dict[str, Any]) -> Action | Decision:
        tid = trial.trial_id
        idx = self._trial_bracket.get(tid)
        t = result.get(self.time_attr)
        others: dict[str, Action] = {}
        if idx is None:
            raise KeyError(f"trial {tid!r} was never added")
        if t is None:
            action = Action.CONTINUE
        else:
            bracket = self._brackets[idx]
            if tid not in bracket.live:
                action = Action.STOP
            elif t >= self._max_t and self._stop_last_trials:
                bracket.leave(tid)
                bracket.num_stopped += 1
                action = Action.STOP
                if bracket.cohort_done():
                    others = bracket.promote()
            elif t < bracket.milestone:
                action = Action.CONTINUE
            elif bracket.is_final:  # at R and not stop_last_trials: run on unchecked
                bracket.reported[tid] = self._score(result)
                action = Action.CONTINUE
            else:
                bracket.reported[tid] = self._score(result)
                if bracket.cohort_done():
                    others = bracket.promote()
                    action = others.pop(tid)
                else:
                    action = Action.PAUSE
        return Decision(action, others=others) if others else action

    def _leave(self, trial: Trial) -> None:
        idx = self._trial_bracket.get(trial.trial_id)
        if idx is None:
            return
        bracket = self._brackets[idx]
        bracket.leave(trial.trial_id)
        self._pending.pop(trial.trial_id, None)
        if bracket.cohort_done():
            self._pending.update(bracket.promote())

    def on_trial_complete(self, trial: Trial, result: dict[str, Any]) -> None:
        self._leave(trial)

    def on_trial_error(self, trial: Trial) -> None:
        self._leave(trial)

    def on_trial_remove(self, trial: Trial) -> None:
        self._leave(trial)

    def _released(self, trial: Trial) -> bool:
        idx = self._trial_bracket.get(trial.trial_id)
        if idx is None:
            return True
        bracket = self._brackets[idx]
        return trial.trial_id in bracket.live and (
            bracket.is_final or trial.trial_id not in bracket.reported
        )

    def choose_trial_to_run(self, trials: Sequence[Trial]) -> Trial | None:
        """Pending trials first, in order; then promoted paused trials, least recently trained."""
        for trial in trials:
            if trial.status == TrialStatus.PENDING:
                return trial
        paused = [t for t in trials if t.status == TrialStatus.PAUSED and self._released(t)]
        return min(paused, key=lambda t: t.last_train_time) if paused else None

    def next_milestone(self, trial: Trial) -> float | None:
        """The trial's bracket's current ``r_i``; None once it left or runs on past ``R``."""
        idx = self._trial_bracket.get(trial.trial_id)
        if idx is None:
            return None
        bracket = self._brackets[idx]
        if trial.trial_id not in bracket.live:
            return None
        if bracket.is_final and trial.trial_id in bracket.reported:
            return None
        return bracket.milestone

    # -- persistence ---------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        state.update(
            {
                "pending": {k: v.value for k, v in self._pending.items()},
                "trial_bracket": dict(self._trial_bracket),
                "brackets": [
                    {
                        "s": b.s,
                        "rung": b.rung,
                        "members": list(b.members),
                        "live": list(b.live),
                        "reported": dict(b.reported),
                        "num_stopped": b.num_stopped,
                    }
                    for b in self._brackets
                ],
            }
        )
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        by_s = {len(rungs) - 1: rungs for rungs in self._plan}
        brackets = []
        for k, saved in enumerate(state["brackets"]):
            expected = self._plan[k % len(self._plan)]
            if saved["s"] != len(expected) - 1:
                raise ValueError(
                    f"saved HyperBand state has bracket s={saved['s']} at position {k}, "
                    f"expected s={len(expected) - 1}: construct the scheduler with the "
                    f"same max_t and reduction_factor"
                )
            b = self._bracket_type(saved["s"], by_s[saved["s"]])
            b.rung = int(saved["rung"])
            b.members = list(saved["members"])
            b.live = list(saved["live"])
            b.reported = {k: float(v) for k, v in saved["reported"].items()}
            b.num_stopped = int(saved["num_stopped"])
            brackets.append(b)
        super().set_state(state)
        self._brackets = brackets
        self._pending = {k: Action(v) for k, v in state["pending"].items()}
        self._trial_bracket = {k: int(v) for k, v in state["trial_bracket"].items()}

    def debug_string(self) -> str:
        lines = [
            f"Using HyperBand: num_stopped={self.num_stopped} total_brackets={len(self._brackets)}"
        ]
        lines += ["  " + b.describe() for b in self._brackets]
        return "\n".join(lines)
