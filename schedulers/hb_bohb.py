"""Ray Tune's ``HyperBandForBOHB``: HyperBand whose brackets wait for the searcher to fill them.

Ray's ``HyperBandForBOHB`` changes its ``HyperBandScheduler`` in two ways, both here:

1. the largest bracket (``s = s_max``) is filled first; popflow's
   :class:`~popflow.schedulers.hyperband.HyperBandScheduler` already does, as the paper;
2. a trial at its bracket's first milestone is paused even while the bracket is not
   filled, so that the searcher (``TuneBOHB``) can add trials to it; the first halving
   waits until the bracket has its ``n`` trials, or until nothing else runs and no new
   trial comes (Ray's ``choose_trial_to_run``: with no trial running, the brackets with
   paused trials are processed as they are). popflow's ``HyperBandScheduler`` halves a
   cohort as soon as every trial it holds has reported, filled or not.

Where Ray reaches into the searcher from here, popflow's driver does it: it tells the
run's searcher of each pause and resume (``on_pause``/``on_unpause``, committed and
replayed with the other calls), so ``TuneBOHB`` counts running trials only against its
``max_concurrent`` (a ``ConcurrencyLimiter`` hands it its limit, as in Ray). Ray writes
``result["hyperband_info"]["budget"]`` into a result before the searcher sees it;
popflow's driver tells the searcher first, so ``TuneBOHB`` takes a result's budget from
its ``time_attr``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from popflow.schedulers.hyperband import HyperBandScheduler, _Bracket
from popflow.schedulers.trial import Trial
from popflow.schedulers.trial_scheduler import Action, Decision

__all__ = ["HyperBandForBOHB"]


class _FillingBracket(_Bracket):
    """A bracket whose first halving waits until it holds its ``n`` trials."""

    def filled(self) -> bool:
        return len(self.members) >= self.rungs[0].n

    def cohort_done(self) -> bool:
        if self.rung == 0 and not self.filled():
            return False
        return super().cohort_done()

    def waiting(self) -> bool:
        """Every live trial reported at the first milestone of an unfilled bracket."""
        return self.rung == 0 and not self.is_final and _Bracket.cohort_done(self)


class HyperBandForBOHB(HyperBandScheduler):
    """Ray's ``HyperBandForBOHB``: :class:`HyperBandScheduler`'s arguments and brackets
    (``s = s_max`` first); a bracket's first halving waits until it is filled, or until
    no trial runs and none is to start (then it halves as it is).

    Controller contract: :class:`HyperBandScheduler`'s, and ``choose_trial_to_run`` may
    halve a waiting bracket when no trial of this scheduler is running and none is
    pending: it returns a promoted trial, and the stopped ones are stopped through the
    ``others`` of the next :class:`Decision` (the next result's, or
    :meth:`release_paused`'s).
    """

    def __init__(
        self,
        time_attr: str = "training_iteration",
        metric: str | None = None,
        mode: str | None = None,
        max_t: float = 81,
        reduction_factor: float = 3,
        stop_last_trials: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            time_attr=time_attr,
            metric=metric,
            mode=mode,
            max_t=max_t,
            reduction_factor=reduction_factor,
            stop_last_trials=stop_last_trials,
            **kwargs,
        )
        self._running: set[str] = set()  # chosen to run, not yet at a milestone or ended

    _bracket_type = _FillingBracket

    # -- hooks ---------------------------------------------------------------
    def on_trial_result(self, trial: Trial, result: dict[str, Any]) -> Action | Decision:
        target = self.next_milestone(trial)
        out = super().on_trial_result(trial, result)
        decision = Decision.of(out)
        t = result.get(self.time_attr)
        reached = target is not None and t is not None and t >= target
        if decision.action in (Action.PAUSE, Action.STOP) or reached:
            self._running.discard(trial.trial_id)
        stops = {k: v for k, v in self._pending.items() if v == Action.STOP}
        if not stops:
            return out
        for tid in stops:
            self._pending.pop(tid)
        stops.pop(trial.trial_id, None)
        return Decision(decision.action, others={**stops, **decision.others})

    def _leave(self, trial: Trial) -> None:
        self._running.discard(trial.trial_id)
        super()._leave(trial)

    def choose_trial_to_run(self, trials: Sequence[Trial]) -> Trial | None:
        """:class:`HyperBandScheduler`'s choice; when it has none and no trial runs, the
        waiting brackets halve as they are (Ray's "process the bracket") first."""
        chosen = super().choose_trial_to_run(trials)
        if chosen is None and not self._running:
            halved = False
            for bracket in self._brackets:
                if bracket.waiting():
                    actions = bracket.promote()
                    # the promoted run now (chosen below); the others stop with the next
                    # decision this scheduler hands out
                    self._pending.update({k: v for k, v in actions.items() if v == Action.STOP})
                    halved = True
            if halved:
                chosen = super().choose_trial_to_run(trials)
        if chosen is not None:
            self._running.add(chosen.trial_id)
        return chosen

    # -- persistence ---------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        state["running"] = sorted(self._running)
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        super().set_state(state)
        self._running = set(state.get("running", []))

    def debug_string(self) -> str:
        return super().debug_string().replace("Using HyperBand:", "Using HyperBandForBOHB:", 1)
