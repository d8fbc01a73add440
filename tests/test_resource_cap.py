"""ResourceChangingScheduler: a trial is one slot on one worker, so an allocation larger
than the biggest worker is cut to it, warned naming both; and under PBT (time in
seconds, pauses that are barriers) trials are still resized at every result."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from popflow.schedulers import FIFOScheduler, PopulationBasedTraining, Trial, TrialStatus
from popflow.schedulers.placement import PlacementGroupFactory
from popflow.schedulers.resource_changing import DistributeResources, ResourceChangingScheduler
from popflow.schedulers.trial_scheduler import Action

pytestmark = pytest.mark.unit

ONE_CPU = PlacementGroupFactory([{"CPU": 1}])


def _running(
    function: Any,
    totals: dict[str, float],
    largest: dict[str, float] | None = None,
    base: Any = None,
) -> tuple[ResourceChangingScheduler, Trial]:
    rcs = ResourceChangingScheduler(base or FIFOScheduler(), function)
    rcs.set_base_trial_resources(ONE_CPU)
    rcs.set_cluster_resources(totals, largest)
    trial = Trial("a", {"lr": 0.1})
    rcs.on_trial_add(trial)
    trial.status = TrialStatus.RUNNING
    return rcs, trial


def _applied(rcs: ResourceChangingScheduler, trial: Trial) -> dict[str, float]:
    trial.status = TrialStatus.PAUSED
    assert rcs.choose_trials_to_run([trial], None) == [trial]
    return rcs.trial_resources(trial.trial_id).required_resources


def test_an_allocation_larger_than_the_cluster_is_cut_and_warned(caplog) -> None:
    def huge(controller: Any, trial: Trial, result: dict, scheduler: Any) -> Any:
        return PlacementGroupFactory([{"CPU": 64, "GPU": 1}])

    rcs, trial = _running(huge, {"CPU": 2})
    with caplog.at_level(logging.WARNING, logger="popflow.schedulers.resource_changing"):
        assert rcs.on_trial_result(trial, {"training_iteration": 1}) == Action.PAUSE
    assert _applied(rcs, trial).get("GPU", 0.0) == 0.0  # no GPU on the cluster
    assert rcs.trial_resources("a").required_resources["CPU"] == 2.0
    (record,) = caplog.records
    assert "64" in record.getMessage() and "'CPU': 2.0" in record.getMessage()


def test_a_lone_trial_grows_to_the_biggest_worker_not_the_sum() -> None:
    for function in (DistributeResources(), DistributeResources(add_bundles=True)):
        rcs, trial = _running(function, {"CPU": 4}, largest={"CPU": 2})
        assert rcs.on_trial_result(trial, {"training_iteration": 1}) == Action.PAUSE
        assert _applied(rcs, trial) == {"CPU": 2.0}
        # the same cut again is no change: no pause for nothing
        trial.status = TrialStatus.RUNNING
        assert rcs.on_trial_result(trial, {"training_iteration": 2}) == Action.CONTINUE


@pytest.mark.parametrize("synch", [False, True])
def test_under_pbt_segments_end_at_every_result_and_a_resize_is_no_barrier(synch: bool) -> None:
    pbt = PopulationBasedTraining(
        perturbation_interval=2, synch=synch, hyperparam_mutations={"lr": [0.1, 0.2]}
    )
    pbt.set_search_properties("score", "max")
    rcs, trial = _running(DistributeResources(), {"CPU": 2}, base=pbt)
    trial.last_result = {"training_iteration": 1, "time_total_s": 0.01}
    # PBT's milestone is in seconds: the driver cuts segments at each iteration instead
    assert rcs.time_attr == "time_total_s" and rcs.each_result
    assert rcs.next_milestone(trial) == pbt.next_milestone(trial)
    assert rcs.pause_is_barrier is synch
    result = {"training_iteration": 1, "time_total_s": 0.01, "score": 1.0}
    assert rcs.on_trial_result(trial, result) == Action.PAUSE
    # paused to be resized: its live trainable (old resources) must go
    assert rcs.pause_is_barrier is False
    assert _applied(rcs, trial) == {"CPU": 2.0}
    assert rcs.pause_is_barrier is synch
