"""Ray's ``ResourceChangingScheduler``: a trial's CPUs and GPUs grow as others stop.

The scheduler wraps another (the *base*, FIFO by default), which decides as before.
At each result the base lets go on (``CONTINUE``), a *resources allocation function*
may give the trial a new :class:`~popflow.schedulers.placement.PlacementGroupFactory`;
the trial then pauses (its trainable is dropped, as Ray's actor is), the new
allocation is applied once it is no longer running, and it goes on from its latest
checkpoint in a Dask slot of the new size. Nothing here touches the executor:
the driver asks :meth:`ResourceChangingScheduler.trial_resources` what a trial's next
segment holds.

The allocation functions (:class:`DistributeResources`, :class:`DistributeResourcesToTopJob`
of :mod:`popflow.schedulers.resource_allocation`, or a user's
``f(tune_controller, trial, result, scheduler)``) see the run through a
:class:`~popflow.schedulers.resource_allocation.ClusterView`.

Running trials never hold more than the cluster has: :meth:`choose_trials_to_run`
only starts a trial whose allocation fits what the running ones leave (the first
always starts). A trial is one slot on one worker, so an allocation larger than the
biggest worker is cut to what that worker offers, with a warning naming both (Ray waits
for ever, warning; a slot no worker has would never come).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from popflow.schedulers.placement import PlacementGroupFactory
from popflow.schedulers.resource_allocation import (
    ClusterView,
    DistributeResources,
    DistributeResourcesToTopJob,
)
from popflow.schedulers.trial import Trial, TrialStatus
from popflow.schedulers.trial_scheduler import Action, Decision, FIFOScheduler, TrialScheduler

__all__ = [
    "ClusterView",
    "DistributeResources",
    "DistributeResourcesToTopJob",
    "ResourceChangingScheduler",
]

logger = logging.getLogger(__name__)

AllocationFunction = Callable[
    [Any, Trial, dict[str, Any], "ResourceChangingScheduler"], PlacementGroupFactory | None
]


#: Ray's default allocation function (one shared instance: it keeps no state)
_DEFAULT = DistributeResources()


class ResourceChangingScheduler(TrialScheduler):
    """Ray's ``ResourceChangingScheduler(base_scheduler, resources_allocation_function)``.

    ``resources_allocation_function(tune_controller, trial, result, scheduler)`` returns
    the trial's new :class:`PlacementGroupFactory`, or None to leave it (default:
    :class:`DistributeResources`; None: resources never change). Trials start with the
    run's resources (``tune.with_resources``; one CPU if none), which all share.
    """

    def __init__(
        self,
        base_scheduler: TrialScheduler | None = None,
        resources_allocation_function: AllocationFunction | None = _DEFAULT,
    ) -> None:
        super().__init__()
        if base_scheduler is not None and not isinstance(base_scheduler, TrialScheduler):
            raise TypeError(f"`base_scheduler` is {base_scheduler!r}, but must be a TrialScheduler")
        if resources_allocation_function is not None and not callable(
            resources_allocation_function
        ):
            raise TypeError(
                f"`resources_allocation_function` is {resources_allocation_function!r}, but "
                "must be callable(tune_controller, trial, result, scheduler) or None"
            )
        if resources_allocation_function is None:
            logger.warning(
                "`resources_allocation_function` is None: no trial's resources will change"
            )
        self._base_scheduler = base_scheduler or FIFOScheduler()
        self._resources_allocation_function = resources_allocation_function
        #: the run's per-trial resources (Ray reads them off its first trial)
        self._base_trial_resources: PlacementGroupFactory | None = None
        self._allocations: dict[str, PlacementGroupFactory] = {}
        self._pending: dict[str, PlacementGroupFactory] = {}  # applied once not running
        self._trials: dict[str, Trial] = {}
        self._totals: dict[str, float] = {}
        #: what the biggest worker offers: the most one trial can hold
        self._largest: dict[str, float] = {}
        self._warned: set[tuple[tuple[str, float], ...]] = set()

    # -- the base scheduler's properties ---------------------------------------
    synchronous = property(lambda self: self._base_scheduler.synchronous)  # type: ignore[assignment]
    #: a trial paused to be resized must drop its trainable (it restarts in a new slot,
    #: from its checkpoint): while one is pending, pauses are not mere barriers
    pause_is_barrier = property(  # type: ignore[assignment]
        lambda self: self._base_scheduler.pause_is_barrier and not self._pending
    )
    time_shares_slots = property(lambda self: self._base_scheduler.time_shares_slots)  # type: ignore[assignment]
    #: a resized trial goes on from its checkpoint
    needs_checkpoints = property(lambda self: True)  # type: ignore[assignment]

    @property  # type: ignore[override]
    def time_attr(self) -> str:
        return self._base_scheduler.time_attr or "training_iteration"

    @property
    def metric(self) -> str | None:
        return self._base_scheduler.metric

    @property
    def mode(self) -> str | None:
        return self._base_scheduler.mode

    @property
    def logs_policy(self) -> bool:
        return self._base_scheduler.logs_policy

    @property
    def base_trial_resources(self) -> PlacementGroupFactory | None:
        return self._base_trial_resources

    def set_search_properties(self, metric: str | None, mode: str | None) -> bool:
        return self._base_scheduler.set_search_properties(metric, mode)

    def set_rng(self, rng: np.random.Generator) -> None:
        super().set_rng(rng)
        self._base_scheduler.set_rng(rng)

    # -- what the driver tells it, and asks ------------------------------------
    def set_base_trial_resources(self, resources: PlacementGroupFactory) -> None:
        """The run's per-trial resources, which every trial starts with."""
        self._base_trial_resources = resources

    def set_cluster_resources(
        self, totals: Mapping[str, float], largest: Mapping[str, float] | None = None
    ) -> None:
        """The cluster's resources in all (``{"CPU": 8, "GPU": 0}``), shared by the trials,
        and what its biggest worker offers (default: ``totals``), the most one trial holds."""
        self._totals = {k: float(v) for k, v in totals.items()}
        self._largest = {k: float(v) for k, v in (totals if largest is None else largest).items()}

    def trial_resources(self, trial_id: str) -> PlacementGroupFactory:
        """What ``trial_id``'s next segment holds."""
        found = self._allocations.get(trial_id)
        if found is not None:
            return found
        return self._base_trial_resources or PlacementGroupFactory.from_resources(None)

    def view(self) -> ClusterView:
        return ClusterView(list(self._trials.values()), self._totals)

    # -- hooks -----------------------------------------------------------------
    def complete_config(self, config: dict[str, Any]) -> dict[str, Any]:
        return self._base_scheduler.complete_config(config)

    def on_trial_add(self, trial: Trial) -> None:
        self._trials[trial.trial_id] = trial
        self._base_scheduler.on_trial_add(trial)

    def on_trial_result(self, trial: Trial, result: dict[str, Any]) -> Action | Decision:
        decision = Decision.of(self._base_scheduler.on_trial_result(trial, result))
        if decision.action != Action.CONTINUE or self._resources_allocation_function is None:
            return decision
        new = self._resources_allocation_function(self.view(), trial, result, self)
        if new is None or new == self.trial_resources(trial.trial_id):
            self._pending.pop(trial.trial_id, None)
            return decision
        if not isinstance(new, PlacementGroupFactory):
            raise TypeError(
                f"the resources allocation function returned {new!r}, but must return a "
                "PlacementGroupFactory or None"
            )
        new = self._within_a_worker(trial, new)
        if new == self.trial_resources(trial.trial_id):
            self._pending.pop(trial.trial_id, None)
            return decision
        self._pending[trial.trial_id] = new
        return Decision(Action.PAUSE, decision.exploits, decision.others)

    def _within_a_worker(self, trial: Trial, new: PlacementGroupFactory) -> PlacementGroupFactory:
        """``new`` cut to what the biggest worker offers (a slot no worker has never comes)."""
        capped = _capped(new, self._largest)
        if capped == new:
            return new
        asked = new.required_resources
        key = tuple(sorted(asked.items()))
        # ours ask for the summed cluster by design: said once each, at debug
        ours = isinstance(self._resources_allocation_function, DistributeResources)
        level = logging.DEBUG if ours or key in self._warned else logging.WARNING
        self._warned.add(key)
        logger.log(
            level,
            "The resources allocation function gave trial %s %s, but a trial is one slot on "
            "one worker and the biggest worker has %s (the cluster in all: %s): it gets %s",
            trial.trial_id,
            asked,
            self._largest,
            self._totals,
            capped.required_resources,
        )
        return capped

    def on_trial_complete(self, trial: Trial, result: dict[str, Any]) -> None:
        self._pending.pop(trial.trial_id, None)
        self._base_scheduler.on_trial_complete(trial, result)

    def on_trial_error(self, trial: Trial) -> None:
        self._base_scheduler.on_trial_error(trial)

    def on_trial_remove(self, trial: Trial) -> None:
        self._pending.pop(trial.trial_id, None)
        self._base_scheduler.on_trial_remove(trial)

    def release_paused(self) -> Decision | None:
        return self._base_scheduler.release_paused()

    def _apply_pending(self) -> None:
        for trial_id, new in list(self._pending.items()):
            trial = self._trials.get(trial_id)
            if trial is not None and trial.status == TrialStatus.RUNNING:
                continue  # applied once its segment is back
            logger.info("Setting trial %s resource to %s", trial_id, new.bundles)
            self._allocations[trial_id] = new
            del self._pending[trial_id]

    def choose_trial_to_run(self, trials: Sequence[Trial]) -> Trial | None:
        picked = self.choose_trials_to_run(trials, 1)
        return picked[0] if picked else None

    def choose_trials_to_run(self, trials: Sequence[Trial], limit: int | None) -> list[Trial]:
        """The base's picks, in order, while each fits what the running trials leave."""
        self._apply_pending()
        picked = self._base_scheduler.choose_trials_to_run(trials, limit)
        if not self._totals:
            return picked
        running = [t for t in self._trials.values() if t.status == TrialStatus.RUNNING]
        held = [self.trial_resources(t.trial_id).required_resources for t in running]
        out: list[Trial] = []
        for trial in picked:
            need = self.trial_resources(trial.trial_id).required_resources
            if (held or out) and not _fits(need, held, self._totals):
                break  # in order: a bigger trial is not overtaken for ever by smaller ones
            out.append(trial)
            held.append(need)
        return out

    @property
    def each_result(self) -> bool:
        """Segments end at every result, where resources may change (Ray asks the
        allocation function at each): the driver cuts them at one iteration, since the
        base may measure time in other units (PBT's ``time_total_s``)."""
        return self._resources_allocation_function is not None

    def next_milestone(self, trial: Trial) -> float | None:
        """The base's, and every result when resources may change (Ray decides at each)."""
        base = self._base_scheduler.next_milestone(trial)
        if not self.each_result or self.time_attr != "training_iteration":
            return base  # the driver's one-iteration cut ends the segment instead
        step = float(trial.last_result.get(self.time_attr, 0)) + 1
        return step if base is None else min(base, step)

    # -- persistence -----------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        return {
            **super().get_state(),
            "base": self._base_scheduler.get_state(),
            "base_trial_resources": (
                self._base_trial_resources.to_json() if self._base_trial_resources else None
            ),
            "allocations": {k: v.to_json() for k, v in self._allocations.items()},
            "pending": {k: v.to_json() for k, v in self._pending.items()},
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        super().set_state(state)
        self._base_scheduler.set_state(state["base"])
        base = state.get("base_trial_resources")
        if base is not None and self._base_trial_resources is None:
            self._base_trial_resources = PlacementGroupFactory.from_json(base)
        self._allocations = {
            k: PlacementGroupFactory.from_json(v) for k, v in state.get("allocations", {}).items()
        }
        self._pending = {
            k: PlacementGroupFactory.from_json(v) for k, v in state.get("pending", {}).items()
        }

    def debug_string(self) -> str:
        return f"(ResourceChangingScheduler) {self._base_scheduler.debug_string()}"


def _fits(
    need: Mapping[str, float], held: Sequence[Mapping[str, float]], totals: Mapping[str, float]
) -> bool:
    """Whether ``need`` fits ``totals`` beside ``held`` (resources the totals do not name:
    not counted here; Dask places them)."""
    eps = 1e-9
    return all(
        sum(h.get(k, 0.0) for h in held) + v <= totals[k] + eps
        for k, v in need.items()
        if k in totals
    )


def _capped(pgf: PlacementGroupFactory, largest: Mapping[str, float]) -> PlacementGroupFactory:
    """``pgf`` within ``largest`` (unknown: as it is): its last bundles dropped, then its
    first bundle's amounts cut. GPUs a worker does not name: none."""
    if not largest:
        return pgf
    limits = {"GPU": 0.0, **largest}
    eps = 1e-9

    def over(bundles: list[dict[str, float]]) -> bool:
        need: dict[str, float] = {}
        for b in bundles:
            for k, v in b.items():
                need[k] = need.get(k, 0.0) + v
        return any(v > limits[k] + eps for k, v in need.items() if k in limits)

    bundles = [dict(b) for b in pgf.bundles]
    if not over(bundles):
        return pgf
    while len(bundles) > 1 and over(bundles):
        bundles.pop()
    if over(bundles):
        bundles[0] = {k: min(v, limits[k]) if k in limits else v for k, v in bundles[0].items()}
    return PlacementGroupFactory(bundles, pgf.strategy)
