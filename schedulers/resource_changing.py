"""Ray's ``ResourceChangingScheduler``: a trial's CPUs and GPUs grow as others stop.

The scheduler wraps another (the *base*, FIFO by default), which decides as before.
At each result the base lets go on (``CONTINUE``), a *resources allocation function*
may give the trial a new :class:`~popflow.schedulers.placement.PlacementGroupFactory`;
the trial then pauses (its trainable is dropped, as Ray's actor is), the new
allocation is applied once it is no longer running, and it goes on from its latest
checkpoint in a Dask slot of the new size. Nothing here touches the executor:
the driver asks :meth:`ResourceChangingScheduler.trial_resources` what a trial's next
segment holds.

The allocation functions (:class:`DistributeResources`, :class:`DistributeResourcesToTopJob`,
or a user's ``f(tune_controller, trial, result, scheduler)``) see the run through
:class:`ClusterView`, the part of Ray's ``TuneController`` they read: the live
trials and the cluster's total CPUs/GPUs (``_resource_updater.get_num_cpus()``).

Running trials never hold more than the cluster has: :meth:`choose_trials_to_run`
only starts a trial whose allocation fits what the running ones leave (the first
always starts, so a trial larger than the cluster cannot wait for ever).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from popflow.schedulers.placement import PlacementGroupFactory
from popflow.schedulers.trial import Trial, TrialStatus
from popflow.schedulers.trial_scheduler import Action, Decision, FIFOScheduler, TrialScheduler

logger = logging.getLogger(__name__)

AllocationFunction = Callable[
    [Any, Trial, dict[str, Any], "ResourceChangingScheduler"], PlacementGroupFactory | None
]
_LIVE = (TrialStatus.PENDING, TrialStatus.RUNNING, TrialStatus.PAUSED)


class _Totals:
    """Ray's ``_resource_updater``: the cluster's CPUs and GPUs in all (not just free)."""

    def __init__(self, totals: Mapping[str, float]) -> None:
        self._totals = dict(totals)

    def get_num_cpus(self) -> float:
        return self._totals.get("CPU", 0.0)

    def get_num_gpus(self) -> float:
        return self._totals.get("GPU", 0.0)


class ClusterView:
    """What an allocation function gets as Ray's ``tune_controller``: read-only."""

    def __init__(self, trials: Sequence[Trial], totals: Mapping[str, float]) -> None:
        self._trials = list(trials)
        self._resource_updater = _Totals(totals)

    def get_trials(self) -> list[Trial]:
        return list(self._trials)

    def get_live_trials(self) -> list[Trial]:
        """Trials not ended (pending, running or paused), as Ray's."""
        return [t for t in self._trials if t.status in _LIVE]


def _units(free: Mapping[str, float], step: Mapping[str, float]) -> int:
    """How many ``step``s fit ``free`` (negative where ``free`` is short: Ray's multiplier)."""
    counts = [math.floor(free.get(k, 0.0) / v) for k, v in step.items() if v > 0]
    return min(counts) if counts else 0


class DistributeResources:
    """Ray's ``DistributeResources``: free CPUs (or GPUs) shared evenly among the live
    trials, in units of ``increase_by`` (1 CPU; 1 GPU if the base holds a GPU), each
    trial at least its base and at most ``increase_by_times`` units above it (< 1: no
    limit), never beyond what is free. ``reserve_resources`` are never handed out.

    One bundle grows (``add_bundles=False``, Ray's default) or bundles are added
    (``add_bundles=True``); either way they sum to one slot on popflow.

    >>> base = PlacementGroupFactory([{"CPU": 1}])
    >>> DistributeResources().allocate(base, {"CPU": 1}, [{"CPU": 1}], {"CPU": 4}, 1).bundles
    [{'CPU': 4.0}]
    """

    def __init__(
        self,
        add_bundles: bool = False,
        increase_by: Mapping[str, float] | None = None,
        increase_by_times: int = -1,
        reserve_resources: Mapping[str, float] | None = None,
    ) -> None:
        self.add_bundles = add_bundles
        self.increase_by = {k.upper(): float(v) for k, v in (increase_by or {}).items()}
        if self.increase_by and (
            not any(self.increase_by.values()) or min(self.increase_by.values()) < 0
        ):
            raise ValueError(
                f"`increase_by` is {increase_by!r}, but must name at least one amount > 0 "
                "and none < 0"
            )
        self.increase_by_times = increase_by_times
        self.reserve_resources = {k.upper(): float(v) for k, v in (reserve_resources or {}).items()}

    def _step(self, base: PlacementGroupFactory) -> dict[str, float]:
        if self.increase_by:
            return dict(self.increase_by)
        if self.add_bundles:
            return {k: v for k, v in base.bundles[-1].items() if v}
        return {"GPU": 1.0} if base.bundles[0].get("GPU") else {"CPU": 1.0}

    def _cap(self, base: PlacementGroupFactory, totals: Mapping[str, float], live: int) -> int:
        """The most units above its base a trial may get: an even share of what the live
        trials' bases leave (rounded up, Ray's first trial's share), then ``increase_by_times``."""
        step = self._step(base)
        spare = {k: totals.get(k, 0.0) - live * base.required_resources.get(k, 0.0) for k in step}
        cap = max(0, math.ceil(max(0, _units(spare, step)) / max(1, live)))
        if self.increase_by and self.increase_by_times > 0:
            cap = min(cap, self.increase_by_times)
        return cap

    def _with_units(self, base: PlacementGroupFactory, units: int) -> PlacementGroupFactory:
        step = self._step(base)
        if self.add_bundles:
            return PlacementGroupFactory(base.bundles + [dict(step)] * units, base.strategy)
        head, *rest = base.bundles
        grown = {k: head.get(k, 0.0) + units * step.get(k, 0.0) for k in {*head, *step}}
        return PlacementGroupFactory([grown, *rest], base.strategy)

    def _added_units(self, base: PlacementGroupFactory, current: PlacementGroupFactory) -> int:
        step = self._step(base)
        have, floor = current.required_resources, base.required_resources
        return max(0, _units({k: have.get(k, 0.0) - floor.get(k, 0.0) for k in step}, step))

    def _free(
        self, totals: Mapping[str, float], used: Sequence[Mapping[str, float]]
    ) -> dict[str, float]:
        names = {*totals, *(k for u in used for k in u)}
        return {
            k: totals.get(k, 0.0)
            - self.reserve_resources.get(k, 0.0)
            - sum(u.get(k, 0.0) for u in used)
            for k in names
        }

    def allocate(
        self,
        base: PlacementGroupFactory,
        current: Mapping[str, float],
        used: Sequence[Mapping[str, float]],
        totals: Mapping[str, float],
        live: int,
    ) -> PlacementGroupFactory:
        """The trial's new resources: ``current`` what it holds, ``used`` what every live
        trial holds (it among them), ``totals`` the cluster's, ``live`` the live trials."""
        free = self._free(totals, used)
        have = PlacementGroupFactory([dict(current)]) if current else base
        units = self._added_units(base, have)
        units = min(
            units + _units(free, self._step(base)), self._cap(base, self._reserved(totals), live)
        )
        return self._with_units(base, max(0, units))

    def _reserved(self, totals: Mapping[str, float]) -> dict[str, float]:
        return {k: v - self.reserve_resources.get(k, 0.0) for k, v in totals.items()}

    def _check(self, base: PlacementGroupFactory, result: Mapping[str, Any]) -> bool:
        if not self.add_bundles and len(base.bundles) > 1:
            raise ValueError(
                "If `add_bundles` is False, the number of bundles in `resources_per_trial` "
                f"must be 1 (got {len(base.bundles)})."
            )
        return result.get("training_iteration", 0) >= 1

    def __call__(
        self,
        tune_controller: ClusterView,
        trial: Trial,
        result: dict[str, Any],
        scheduler: ResourceChangingScheduler,
    ) -> PlacementGroupFactory | None:
        base = scheduler.base_trial_resources or PlacementGroupFactory.from_resources(None)
        if not self._check(base, result):
            return None
        live = tune_controller.get_live_trials()
        used = [scheduler.trial_resources(t.trial_id).required_resources for t in live]
        totals = tune_controller._resource_updater._totals
        current = scheduler.trial_resources(trial.trial_id).required_resources
        return self.allocate(base, current, used, totals, len(live))


class DistributeResourcesToTopJob(DistributeResources):
    """Ray's ``DistributeResourcesToTopJob``: every free CPU (or GPU) to the best live
    trial by ``metric``/``mode`` (the scheduler's when not given) that is below its
    ``increase_by_times`` limit; the others keep what they hold while nothing is short."""

    def __init__(
        self,
        add_bundles: bool = False,
        increase_by: Mapping[str, float] | None = None,
        increase_by_times: int = -1,
        reserve_resources: Mapping[str, float] | None = None,
        metric: str | None = None,
        mode: str | None = None,
    ) -> None:
        super().__init__(add_bundles, increase_by, increase_by_times, reserve_resources)
        if mode not in (None, "min", "max"):
            raise ValueError(f"`mode` is {mode!r}, but must be 'min', 'max' or None")
        self.metric = metric
        self.mode = mode

    def __call__(
        self,
        tune_controller: ClusterView,
        trial: Trial,
        result: dict[str, Any],
        scheduler: ResourceChangingScheduler,
    ) -> PlacementGroupFactory | None:
        base = scheduler.base_trial_resources or PlacementGroupFactory.from_resources(None)
        if not self._check(base, result):
            return None
        metric = self.metric or scheduler.metric
        mode = self.mode or scheduler.mode or "max"
        if metric is None:
            raise ValueError(
                "The metric parameter cannot be None. The parameter can be set in either "
                "`DistributeResourcesToTopJob`, the base scheduler or in `tune.TuneConfig()` "
                "(highest to lowest priority)."
            )
        live = tune_controller.get_live_trials()
        used = [scheduler.trial_resources(t.trial_id).required_resources for t in live]
        free = self._free(tune_controller._resource_updater._totals, used)
        sign = 1.0 if mode == "max" else -1.0
        ranked = sorted(
            live, key=lambda t: -sign * float(t.last_result.get(metric, sign * -np.inf))
        )
        limit = self.increase_by_times if self.increase_by and self.increase_by_times > 0 else None

        def below_limit(t: Trial) -> bool:
            return (
                limit is None
                or self._added_units(base, scheduler.trial_resources(t.trial_id)) < limit
            )

        best = next((t for t in ranked if below_limit(t)), ranked[0] if ranked else trial)
        current = scheduler.trial_resources(trial.trial_id)
        units = self._added_units(base, current)
        step = self._step(base)
        if trial.trial_id != best.trial_id and _units(free, step) >= 0:
            return self._with_units(base, units)
        units += _units(free, step)
        if limit is not None:
            units = min(units, limit)
        return self._with_units(base, max(0, units))


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

    # -- the base scheduler's properties ---------------------------------------
    synchronous = property(lambda self: self._base_scheduler.synchronous)  # type: ignore[assignment]
    pause_is_barrier = property(lambda self: self._base_scheduler.pause_is_barrier)  # type: ignore[assignment]
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

    def set_cluster_resources(self, totals: Mapping[str, float]) -> None:
        """The cluster's resources in all (``{"CPU": 8, "GPU": 0}``), shared by the trials."""
        self._totals = {k: float(v) for k, v in totals.items()}

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
        self._pending[trial.trial_id] = new
        return Decision(Action.PAUSE, decision.exploits, decision.others)

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

    def next_milestone(self, trial: Trial) -> float | None:
        """The base's, and every result when resources may change (Ray decides at each)."""
        base = self._base_scheduler.next_milestone(trial)
        if self._resources_allocation_function is None:
            return base
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
