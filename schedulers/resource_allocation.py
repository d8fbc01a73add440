"""The resources allocation functions of Ray's ``ResourceChangingScheduler``
(:mod:`popflow.schedulers.resource_changing`): pure functions of what the live trials hold
and what the cluster has, returning a trial's new
:class:`~popflow.schedulers.placement.PlacementGroupFactory`.

They see the run through :class:`ClusterView`, the part of Ray's ``TuneController`` they
read: the live trials and the cluster's total CPUs/GPUs (``_resource_updater.get_num_cpus()``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from popflow.schedulers.placement import PlacementGroupFactory
from popflow.schedulers.trial import Trial, TrialStatus

if TYPE_CHECKING:
    from popflow.schedulers.resource_changing import ResourceChangingScheduler

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
