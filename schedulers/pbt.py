"""Population Based Training (Jaderberg et al. 2017), with Ray Tune's arguments.

Jaderberg et al., "Population Based Training of Neural Networks" (2017),
https://arxiv.org/abs/1711.09846.

Every ``perturbation_interval`` units of ``time_attr`` a trial reaches a
perturbation point. The live population is ranked by score; a trial in the
bottom ``quantile_fraction`` *exploits* a trial picked uniformly from the top
``quantile_fraction`` (restarts from its checkpoint) and *explores* (perturbs)
the copied config. The exploit is returned as data (:class:`Exploit`); the
controller copies the checkpoint and sets the config.

- ``synch=False``: each trial is judged on its own as its result arrives.
- ``synch=True``: trials wait (PAUSE) at the barrier until every live trial
  reached it; the last one to report triggers one ranking for the cohort and
  releases everyone (``Decision.others``). If the trial everyone waits for
  completes or errors instead, :meth:`PopulationBasedTraining.release_paused`
  performs that step.

Example::

    >>> import random
    >>> pbt = PopulationBasedTraining(
    ...     time_attr="training_iteration", metric="mean_accuracy", mode="max",
    ...     perturbation_interval=5,
    ...     hyperparam_mutations={"lr": lambda: random.uniform(1e-4, 1e-1),
    ...                           "batch_size": [16, 32, 64]})
    >>> pbt.debug_string()
    'PopulationBasedTraining: 0 checkpoints, 0 perturbs'
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from popflow.schedulers.pbt_explore import (
    ExploreFn,
    explore,
    fill_missing,
    missing_paths,
    perturbed_tag,
    validate_mutations,
)
from popflow.schedulers.pbt_population import (
    TrialState,
    quantiles,
    states_from_rows,
    states_to_rows,
)
from popflow.schedulers.trial import Trial, TrialStatus
from popflow.schedulers.trial_scheduler import (
    Action,
    Decision,
    Exploit,
    TrialScheduler,
    is_nan,
    score,
)
from popflow.schedulers.validation import check_pbt_arguments

__all__ = ["PopulationBasedTraining", "explore", "quantiles"]

logger = logging.getLogger(__name__)

_CONTINUE = Decision(Action.CONTINUE)
_PAUSE = Decision(Action.PAUSE)


def _iteration(result: Mapping[str, Any] | None) -> int:
    return int((result or {}).get("training_iteration", 0))


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


class PopulationBasedTraining(TrialScheduler):
    """Population Based Training; see the module docstring and Ray Tune's docs.

    Arguments and defaults are Ray Tune's. ``log_config``: the run writes
    each exploit to ``pbt_global.txt`` and ``pbt_policy_<trial_id>.txt``
    (:attr:`logs_policy`; the scheduler itself writes no files).
    """

    def __init__(
        self,
        time_attr: str = "time_total_s",
        metric: str | None = None,
        mode: str | None = None,
        perturbation_interval: float = 60.0,
        burn_in_period: float = 0.0,
        hyperparam_mutations: Mapping[str, Any] | None = None,
        quantile_fraction: float = 0.25,
        resample_probability: float = 0.25,
        perturbation_factors: Sequence[float] = (1.2, 0.8),
        custom_explore_fn: ExploreFn | None = None,
        log_config: bool = True,
        require_attrs: bool = True,
        synch: bool = False,
        *,
        rng: np.random.Generator | None = None,
    ) -> None:
        super().__init__(metric=metric, mode=mode, rng=rng)
        mutations = dict(hyperparam_mutations or {})
        check_pbt_arguments(
            hyperparam_mutations,
            custom_explore_fn,
            quantile_fraction,
            resample_probability,
            perturbation_interval,
            burn_in_period,
            perturbation_factors,
            synch=synch,
            log_config=log_config,
            require_attrs=require_attrs,
        )
        validate_mutations(mutations)
        self.time_attr = time_attr
        self.synchronous = synch
        self.pause_is_barrier = synch
        self.time_shares_slots = not synch
        self.needs_checkpoints = True  # an exploit clones the source's checkpoint
        self.log_config = log_config
        self._perturbation_interval = perturbation_interval
        self._burn_in_period = burn_in_period
        self._hyperparam_mutations = mutations
        self._quantile_fraction = quantile_fraction
        self._resample_probability = resample_probability
        self._perturbation_factors = tuple(perturbation_factors)
        self._custom_explore_fn = custom_explore_fn
        self._require_attrs = require_attrs
        self._states: dict[str, TrialState] = {}  # in add order: ties rank by it
        self._waiting: dict[str, None] = {}  # synch: ids paused at the barrier, arrival order
        self._num_live = 0  # trials in _states still live
        self._next_perturbation_sync = max(perturbation_interval, burn_in_period)
        self._num_checkpoints = 0
        self._num_perturbations = 0
        self._warned: set[str] = set()

    # -- trial lifecycle -----------------------------------------------------
    def complete_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``config`` with missing mutation keys sampled (lists: uniform choice)."""
        return fill_missing(config, self._hyperparam_mutations, self._rng)

    def on_trial_add(self, trial: Trial) -> None:
        if not self._metric or not self._mode:
            raise ValueError(
                f"{type(self).__name__} has no `metric` ({self._metric!r}) or `mode` "
                f"({self._mode!r}); set them on the scheduler "
                "(PopulationBasedTraining(metric=..., mode=...)) "
                "or in run(metric=..., mode=...)"
            )
        missing = list(missing_paths(trial.config, self._hyperparam_mutations))
        if missing:
            raise ValueError(
                f"trial {trial.trial_id} config lacks mutation keys {missing}; "
                "pass it through complete_config() before on_trial_add()"
            )
        if trial.trial_id not in self._states:  # re-adding after set_state keeps state
            self._states[trial.trial_id] = TrialState(
                orig_tag=trial.experiment_tag, config=copy.deepcopy(trial.config)
            )
            self._num_live += 1

    def on_trial_complete(self, trial: Trial, result: dict[str, Any]) -> None:
        self._retire(trial)

    def on_trial_error(self, trial: Trial) -> None:
        self._retire(trial)

    def on_trial_remove(self, trial: Trial) -> None:
        self._retire(trial)

    def _retire(self, trial: Trial) -> None:
        state = self._states.get(trial.trial_id)
        if state is not None and state.live:
            state.live = False
            self._num_live -= 1
        self._waiting.pop(trial.trial_id, None)

    def _live_ids(self) -> list[str]:
        return [tid for tid, state in self._states.items() if state.live]

    def _all_waiting(self) -> bool:
        """Every live trial waits at the barrier (only live trials wait): O(1) per
        result, not a pass over every trial per result (quadratic in a round's size)."""
        return len(self._waiting) == self._num_live

    # -- results -------------------------------------------------------------
    def on_trial_result(self, trial: Trial, result: dict[str, Any]) -> Decision:
        """CONTINUE between perturbation points; at one (asynchronous) CONTINUE, with
        an exploit if the trial ranks in the bottom quantile; (synch) PAUSE until the
        last live trial arrives, which gets the cohort's exploits and releases it."""
        if trial.trial_id not in self._states:
            raise ValueError(f"trial {trial.trial_id} reported before on_trial_add()")
        missing = [key for key in (self.time_attr, self._metric) if key not in result]
        if missing:
            message = (
                f"result of trial {trial.trial_id} lacks {missing} "
                f"(keys present: {sorted(result)}); make sure the trainable reports them"
            )
            if self._require_attrs:
                raise ValueError(message + ", or set PopulationBasedTraining(require_attrs=False)")
            if not set(missing) <= self._warned:
                self._warned.update(missing)
                logger.warning(message)
            return _CONTINUE

        time = result[self.time_attr]
        state = self._states[trial.trial_id]
        if time < self._burn_in_period:
            return _CONTINUE
        if time - state.last_perturbation_time < self._perturbation_interval:
            return _CONTINUE
        if self.synchronous and time < self._next_perturbation_sync:
            return _CONTINUE  # not at the barrier yet

        self._save_trial_state(state, time, result, trial)

        if not self.synchronous:
            state.last_perturbation_time = time
            lower, upper = self._quantiles()
            exploits = self._checkpoint_or_exploit(trial.trial_id, lower, upper)
            return Decision(Action.CONTINUE, exploits=exploits)

        self._waiting[trial.trial_id] = None
        if not self._all_waiting():
            return _PAUSE  # others have not reached this round's barrier yet
        return self._perturb_cohort(time, reporter=trial.trial_id)

    def _save_trial_state(
        self, state: TrialState, time: float, result: dict[str, Any], trial: Trial
    ) -> None:
        """Record a perturbation point: the score, time, result and config the
        trial's latest checkpoint belongs to (Ray's ``_save_trial_state``; PB2
        also logs its GP data row here)."""
        value = score(result, self._metric, self._mode)
        state.last_score = None if is_nan(value) else value
        state.last_train_time = time
        keys = {self.time_attr, self._metric, "training_iteration"}
        state.last_result = {k: _plain(v) for k, v in result.items() if k in keys}
        state.config = copy.deepcopy(trial.config)

    def release_paused(self) -> Decision | None:
        """Synch mode: run the barrier step if every live trial is now waiting at it.

        Call after ``on_trial_complete``/``on_trial_error``/``on_trial_remove``:
        when the trial the cohort waited for leaves, this ranks the waiting
        trials, and returns their exploits with ``others={id: CONTINUE}`` for
        every waiting trial (``action`` concerns no trial). None if nothing to do.
        """
        if not self.synchronous or not self._waiting:
            return None
        if not self._all_waiting():
            return None
        time = self._states[next(reversed(self._waiting))].last_train_time  # last arrival's time
        return self._perturb_cohort(time, reporter=None)

    def _perturb_cohort(self, time: float, reporter: str | None) -> Decision:
        lower, upper = self._quantiles()
        live = self._live_ids()
        ranked = {*lower, *upper}
        middle = [tid for tid in live if tid not in ranked]
        exploits: list[Exploit] = []
        # Top first, bottom last (Ray's order): sources are settled before targets copy.
        for tid in upper + middle + lower:
            self._states[tid].last_perturbation_time = time
            exploits.extend(self._checkpoint_or_exploit(tid, lower, upper))
        latest = max(self._states[tid].last_train_time for tid in live)
        self._next_perturbation_sync = max(
            self._next_perturbation_sync + self._perturbation_interval, latest
        )
        released = {tid: Action.CONTINUE for tid in live if tid in self._waiting}
        released.pop(reporter, None)
        self._waiting.clear()
        return Decision(Action.CONTINUE, exploits=tuple(exploits), others=released)

    def _quantiles(self) -> tuple[list[str], list[str]]:
        scored = [
            (tid, state.last_score)
            for tid, state in self._states.items()
            if state.live and state.last_score is not None
        ]
        return quantiles(scored, self._quantile_fraction)

    def _metric_value(self, last_score: float | None) -> float | None:
        """A score as the metric's value (``mode="min"`` scores are negated)."""
        if last_score is None:
            return None
        return last_score if self._mode == "max" else -last_score

    def _checkpoint_or_exploit(
        self, trial_id: str, lower: list[str], upper: list[str]
    ) -> tuple[Exploit, ...]:
        # Ray keeps a trial's checkpoint for cloning only when it ranks top at its
        # perturbation point, and skips an exploit whose source (top now) did not then
        state = self._states[trial_id]
        state.clonable = trial_id in upper
        if state.clonable:
            self._num_checkpoints += 1
        if trial_id not in lower:
            return ()
        source_id = upper[int(self._rng.integers(len(upper)))]
        if not self._states[source_id].clonable:
            # a decision: on the console at verbose=3 only (its popflow logger at DEBUG)
            logger.debug(
                "[pbt]: no checkpoint for trial %s. Skip exploit for Trial %s", source_id, trial_id
            )
            return ()
        return (self._exploit(trial_id, source_id),)

    def _exploit(self, trial_id: str, source_id: str) -> Exploit:
        target, source = self._states[trial_id], self._states[source_id]
        new_config, operations = self._get_new_config(trial_id, source_id)
        exploit = Exploit(
            trial_id=trial_id,
            source_trial_id=source_id,
            target_iteration=_iteration(target.last_result),
            source_iteration=_iteration(source.last_result),
            source_config=copy.deepcopy(source.config),
            new_config=new_config,
            operations=operations,
            target_tag=target.orig_tag,
            source_tag=source.orig_tag,
            new_tag=perturbed_tag(target.orig_tag, new_config, self._hyperparam_mutations),
            scheduler=type(self).__name__,
            source_score=self._metric_value(source.last_score),
            target_score=self._metric_value(target.last_score),
        )
        self._num_perturbations += 1
        # The target now holds the source's checkpoint: take over its clock (Ray's
        # _exploit) and the result that checkpoint belongs to, so a later clone of the
        # target logs the right iteration. Its last_score stays until it reports (Ray).
        target.last_perturbation_time = source.last_perturbation_time
        target.last_train_time = source.last_train_time
        target.last_result = copy.deepcopy(source.last_result)
        target.config = copy.deepcopy(new_config)
        return exploit

    def _get_new_config(
        self, trial_id: str, source_id: str
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """The explore step (Ray's ``_get_new_config``): the config ``trial_id``
        restarts with after cloning ``source_id``, and the operations log.
        PBT perturbs the source's config; PB2 overrides this one step."""
        return explore(
            self._states[source_id].config,
            self._hyperparam_mutations,
            self._resample_probability,
            self._perturbation_factors,
            self._custom_explore_fn,
            self._rng,
        )

    # -- planning ------------------------------------------------------------
    def next_milestone(self, trial: Trial) -> float:
        """``max(last_perturbation_time + perturbation_interval, burn_in_period)``.

        In synch mode also at least the round's barrier, so every trial stops there.
        """
        state = self._states.get(trial.trial_id)
        last = state.last_perturbation_time if state is not None else 0
        milestone = max(last + self._perturbation_interval, self._burn_in_period)
        if self.synchronous:
            milestone = max(milestone, self._next_perturbation_sync)
        return milestone

    def choose_trial_to_run(self, trials: Sequence[Trial]) -> Trial | None:
        """Pending or paused trials, least ``time_attr`` progress first (Ray's fairness).

        In synch mode trials paused at the barrier are not candidates.
        """

        return min(self._candidates(trials), key=self._progress, default=None)

    def choose_trials_to_run(self, trials: Sequence[Trial], limit: int | None) -> list[Trial]:
        """What ``choose_trial_to_run`` picks one after the other, by one stable sort."""
        ranked = sorted(self._candidates(trials), key=self._progress)
        return ranked if limit is None else ranked[:limit]

    def _candidates(self, trials: Sequence[Trial]) -> list[Trial]:
        return [
            t
            for t in trials
            if t.status in (TrialStatus.PENDING, TrialStatus.PAUSED)
            and not (self.synchronous and t.trial_id in self._waiting)
        ]

    def _progress(self, trial: Trial) -> float:
        state = self._states.get(trial.trial_id)
        return state.last_train_time if state is not None else 0

    # -- persistence ---------------------------------------------------------
    @property
    def logs_policy(self) -> bool:
        return self.log_config

    def get_state(self) -> dict[str, Any]:
        state = copy.deepcopy(super().get_state())
        state["trials"] = states_to_rows(self._states)  # a copy already
        state["waiting"] = list(self._waiting)
        state["next_perturbation_sync"] = self._next_perturbation_sync
        state["num_checkpoints"] = self._num_checkpoints
        state["num_perturbations"] = self._num_perturbations
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        super().set_state(state)
        self._states = states_from_rows(state["trials"])
        self._num_live = sum(s.live for s in self._states.values())
        self._waiting = dict.fromkeys(state["waiting"])
        self._next_perturbation_sync = state["next_perturbation_sync"]
        self._num_checkpoints = state["num_checkpoints"]
        self._num_perturbations = state["num_perturbations"]

    def debug_string(self) -> str:
        return (
            f"PopulationBasedTraining: {self._num_checkpoints} checkpoints, "
            f"{self._num_perturbations} perturbs"
        )
