"""Ray's ResourceChangingScheduler on popflow: a trial's CPUs grow as others stop.

The allocation (DistributeResources, DistributeResourcesToTopJob) is pure and checked
directly, with properties; the scheduler is driven by hand; one run on the embedded
cluster shows a trial growing into a bigger Dask slot when the other stops.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from popflow.schedulers import ASHAScheduler, FIFOScheduler, Trial, TrialStatus
from popflow.schedulers.placement import PlacementGroupFactory
from popflow.schedulers.resource_changing import (
    ClusterView,
    DistributeResources,
    DistributeResourcesToTopJob,
    ResourceChangingScheduler,
)
from popflow.schedulers.trial_scheduler import Action

ONE_CPU = PlacementGroupFactory([{"CPU": 1}])


# -- PlacementGroupFactory -------------------------------------------------------------
@pytest.mark.unit
def test_a_placement_group_factory_sums_its_bundles_as_ray_does():
    pgf = PlacementGroupFactory([{"CPU": 2, "GPU": 0.5}, {"cpu": 1, "custom": 1}], "SPREAD")
    assert pgf.required_resources == {"CPU": 3.0, "GPU": 0.5, "custom": 1.0}
    assert pgf.head_cpus == 2.0 and not pgf.head_bundle_is_empty
    assert PlacementGroupFactory.from_json(json.loads(json.dumps(pgf.to_json()))) == pgf
    empty_head = PlacementGroupFactory([{}, {"CPU": 2}])
    assert empty_head.head_bundle_is_empty and empty_head.head_cpus == 0.0
    assert PlacementGroupFactory.from_resources(None).required_resources == {"CPU": 1.0}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("bundles", "strategy", "match"),
    [
        ([], "PACK", "non-empty list"),
        ({"CPU": 1}, "PACK", "non-empty list"),
        ([{"CPU": -1}], "PACK", r"bundle 0\['CPU'\] is -1"),
        ([{"CPU": 1}], "NEAR", "must be one of PACK"),
    ],
)
def test_a_placement_group_factory_refuses_what_no_slot_can_hold(bundles, strategy, match):
    with pytest.raises(ValueError, match=match):
        PlacementGroupFactory(bundles, strategy)


# -- DistributeResources: pure allocation ----------------------------------------------
@pytest.mark.unit
def test_free_cpus_are_shared_evenly_among_live_trials():
    d = DistributeResources()
    # 8 CPUs, 2 live trials of 1: each may grow to 4 (an even share), not 7
    grown = d.allocate(ONE_CPU, {"CPU": 1}, [{"CPU": 1}, {"CPU": 1}], {"CPU": 8}, 2)
    assert grown.required_resources == {"CPU": 4.0}
    # alone: all of it
    assert d.allocate(ONE_CPU, {"CPU": 1}, [{"CPU": 1}], {"CPU": 8}, 1).head_cpus == 8.0
    # reserved CPUs are never handed out
    reserved = DistributeResources(reserve_resources={"CPU": 2})
    assert reserved.allocate(ONE_CPU, {"CPU": 1}, [{"CPU": 1}], {"CPU": 8}, 1).head_cpus == 6.0
    # increase_by with a limit
    capped = DistributeResources(increase_by={"CPU": 2}, increase_by_times=1)
    assert capped.allocate(ONE_CPU, {"CPU": 1}, [{"CPU": 1}], {"CPU": 8}, 1).head_cpus == 3.0
    # add_bundles: bundles of the base's kind are added
    added = DistributeResources(add_bundles=True)
    assert (
        added.allocate(ONE_CPU, {"CPU": 1}, [{"CPU": 1}], {"CPU": 3}, 1).bundles
        == [{"CPU": 1.0}] * 3
    )


@pytest.mark.unit
def test_increase_by_must_name_a_positive_amount():
    with pytest.raises(ValueError, match="`increase_by` is"):
        DistributeResources(increase_by={"CPU": 0})


@st.composite
def cluster_states(draw: Any) -> tuple[int, int, list[int], int]:
    """(total CPUs, base CPUs, what each live trial holds, which one reports), where the
    live trials hold no more than the cluster has, each at least its base."""
    base = draw(st.integers(1, 3))
    total = draw(st.integers(base, 32))
    n = draw(st.integers(1, max(1, total // base)))
    held = [base] * n
    spare = total - base * n
    for i in range(n):  # the spare CPUs handed out somehow
        extra = draw(st.integers(0, spare))
        held[i] += extra
        spare -= extra
    return total, base, held, draw(st.integers(0, n - 1))


@pytest.mark.unit
@settings(max_examples=300, deadline=None)
@given(cluster_states(), st.booleans())
def test_an_allocation_never_hands_out_more_than_the_cluster_has(state, top_job):
    total, base_cpu, held, who = state
    base = PlacementGroupFactory([{"CPU": base_cpu}])
    used = [{"CPU": float(h)} for h in held]
    if top_job:
        new = _top_job(base, held, who, total)
    else:
        new = DistributeResources().allocate(base, used[who], used, {"CPU": total}, len(held))
    after = sum(held) - held[who] + new.required_resources["CPU"]
    assert after <= total  # never more than the cluster has
    assert new.required_resources["CPU"] >= base_cpu  # never below its base


def _top_job(base: PlacementGroupFactory, held: list[int], who: int, total: int) -> Any:
    trials = [
        Trial(f"t{i}", {}, TrialStatus.RUNNING, {"score": float(i)}) for i in range(len(held))
    ]
    rcs = ResourceChangingScheduler(
        FIFOScheduler(), DistributeResourcesToTopJob(metric="score", mode="max")
    )
    rcs.set_base_trial_resources(base)
    rcs.set_cluster_resources({"CPU": total})
    for trial, h in zip(trials, held, strict=True):
        rcs.on_trial_add(trial)
        rcs._allocations[trial.trial_id] = PlacementGroupFactory([{"CPU": h}])
    view = ClusterView(trials, {"CPU": total})
    new = rcs._resources_allocation_function(view, trials[who], {"training_iteration": 1}, rcs)
    return new


@pytest.mark.unit
def test_the_top_job_gets_the_free_cpus():
    base = ONE_CPU
    assert _top_job(base, [1, 1], 1, 6).head_cpus == 5.0  # the best (score 1) takes all free
    assert _top_job(base, [1, 1], 0, 6).head_cpus == 1.0  # the other keeps what it holds


# -- the scheduler -------------------------------------------------------------------
def _scheduler(
    function: Any = None, base: Any = None
) -> tuple[ResourceChangingScheduler, list[Trial]]:
    rcs = ResourceChangingScheduler(base or FIFOScheduler(), function or DistributeResources())
    rcs.set_base_trial_resources(ONE_CPU)
    rcs.set_cluster_resources({"CPU": 2})
    trials = [Trial("a", {}), Trial("b", {})]
    for t in trials:
        rcs.on_trial_add(t)
    return rcs, trials


@pytest.mark.unit
def test_a_trial_grows_when_the_other_stops_and_pauses_to_take_it():
    rcs, (a, b) = _scheduler()
    assert [t.trial_id for t in rcs.choose_trials_to_run([a, b], None)] == ["a", "b"]
    a.status = b.status = TrialStatus.RUNNING
    # both live: nothing free, nothing changes
    assert rcs.on_trial_result(b, {"training_iteration": 1}) == Action.CONTINUE
    a.status = TrialStatus.TERMINATED
    rcs.on_trial_complete(a, {"training_iteration": 1})
    # a stopped: b gets its CPU, through a pause (its segment is still running)
    assert rcs.on_trial_result(b, {"training_iteration": 2}) == Action.PAUSE
    assert rcs.trial_resources("b") == ONE_CPU
    b.status = TrialStatus.PAUSED
    assert rcs.choose_trials_to_run([b], None) == [b]
    assert rcs.trial_resources("b").required_resources == {"CPU": 2.0}
    # and says so once: the same allocation again is no change
    b.status = TrialStatus.RUNNING
    assert rcs.on_trial_result(b, {"training_iteration": 3}) == Action.CONTINUE


@pytest.mark.unit
def test_running_trials_never_hold_more_than_the_cluster():
    def grow_a(controller: Any, trial: Trial, result: dict, scheduler: Any) -> Any:
        return PlacementGroupFactory([{"CPU": 2}]) if trial.trial_id == "a" else None

    rcs, (a, b) = _scheduler(grow_a)
    rcs._allocations["a"] = PlacementGroupFactory([{"CPU": 2}])
    # a needs the whole cluster: b waits behind it, not beside it
    assert rcs.choose_trials_to_run([a, b], None) == [a]
    a.status = TrialStatus.RUNNING
    assert rcs.choose_trials_to_run([b], None) == []
    a.status = TrialStatus.TERMINATED
    assert rcs.choose_trials_to_run([b], None) == [b]


@pytest.mark.unit
def test_the_base_schedulers_stop_wins_and_milestones_come_every_result():
    asha = ASHAScheduler(metric="loss", mode="min", max_t=16, grace_period=4)
    rcs, (a, _) = _scheduler(base=asha)
    a.last_result = {"training_iteration": 2}
    assert rcs.next_milestone(a) == 3  # Ray decides resources at every result
    assert ResourceChangingScheduler(asha, None).next_milestone(a) == asha.next_milestone(a)
    assert rcs.metric == "loss" and rcs.time_attr == "training_iteration"


@pytest.mark.unit
def test_a_resumed_scheduler_keeps_each_trials_resources():
    rcs, _ = _scheduler()
    rcs._allocations["b"] = PlacementGroupFactory([{"CPU": 2}], "SPREAD")
    rcs._pending["a"] = PlacementGroupFactory([{"CPU": 1}, {"CPU": 1}])
    state = json.loads(json.dumps(rcs.get_state()))  # committed as JSON
    again, _ = _scheduler()
    again.set_state(state)
    assert again.trial_resources("b") == PlacementGroupFactory([{"CPU": 2}], "SPREAD")
    assert again._pending == rcs._pending


@pytest.mark.unit
def test_rays_example_allocation_function_reads_what_it_expects():
    """The example's function reads ``scheduler._base_trial_resources``,
    ``tune_controller._resource_updater.get_num_cpus()`` and ``get_live_trials()``."""
    rcs, (a, b) = _scheduler()
    view = rcs.view()
    assert rcs._base_trial_resources == ONE_CPU
    assert view._resource_updater.get_num_cpus() == 2.0
    assert view.get_live_trials() == [a, b]


# -- a run on the embedded cluster ---------------------------------------------------
def _slot_cpus() -> float:
    """The CPUs the Dask slot running this segment holds (the one slot task executing
    on this single-threaded worker)."""
    from distributed import Worker

    # the trial's function runs in a thread of its own, where get_worker() finds none
    (worker,) = list(Worker._instances)
    tasks = worker.state.tasks.values()
    held = [
        t.resource_restrictions or {}
        for t in tasks
        if "-slot-" in str(t.key) and t.state == "executing"
    ]
    return sum(r.get("CPU", 0.0) for r in held)


def grows(config: dict[str, Any]) -> None:
    """Reports each iteration with a checkpoint; the long trial ends once it has trained
    three iterations on 2 CPUs (or after ``iterations``)."""
    import os
    import tempfile

    from popflow import tune

    start, grown = 0, 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            start, grown = json.load(f)
    held = tune.get_context().get_trial_resources()
    for i in range(start, config["iterations"]):
        grown += held.head_cpus == 2
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump([i + 1, grown], f)
            metrics = {"score": i, "cpus": held.head_cpus, "slot_cpus": _slot_cpus()}
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(d))
        if grown >= 3:
            return


@pytest.mark.integration
def test_a_trial_grows_into_a_bigger_slot_when_the_other_stops(prefect_server, tmp_path):
    """Two trials share 2 CPUs; once the short one ends, the long one gets both: its
    ``get_trial_resources()`` says 2 and its segments run in a Dask slot holding 2."""
    import popflow
    from popflow import run

    try:
        popflow.init(num_cpus=2)
        results = run(
            grows,
            {"iterations": popflow.tune.grid_search([2, 200])},
            scheduler=ResourceChangingScheduler(FIFOScheduler()),
            metric="score",
            mode="max",
            storage=str(tmp_path),
            name="grows",
            verbose=0,
        )
    finally:
        popflow.init()
    short, long = sorted(results, key=lambda r: r.config["iterations"])
    assert short.metrics["cpus"] == 1.0 and short.metrics["training_iteration"] == 2
    history = long.metrics_dataframe
    assert history["cpus"].iloc[0] == 1.0 and history["slot_cpus"].iloc[0] == 1.0
    assert list(history["cpus"].iloc[-3:]) == [2.0] * 3
    assert list(history["slot_cpus"].iloc[-3:]) == [2.0] * 3
    assert long.metrics["training_iteration"] < 200


def grow_at_three(controller: Any, trial: Trial, result: dict, scheduler: Any) -> Any:
    """2 CPUs at iteration 3, and no opinion after: a resume that forgot would go back
    to the base's 1."""
    return PlacementGroupFactory([{"CPU": 2}]) if result["training_iteration"] == 3 else None


def fails_once_at_six(config: dict[str, Any]) -> None:
    """Reports its CPUs each iteration with a checkpoint; the first run errors at 6."""
    import os
    import tempfile

    from popflow import tune

    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d, open(os.path.join(d, "it")) as f:
            start = int(f.read())
    cpus = tune.get_context().get_trial_resources().head_cpus
    for i in range(start, 8):
        if i == 5 and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            raise RuntimeError("failing once")
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "it"), "w") as f:
                f.write(str(i + 1))
            tune.report({"cpus": cpus}, checkpoint=tune.Checkpoint.from_directory(d))


@pytest.mark.integration
def test_a_resumed_run_goes_on_with_the_resources_it_committed(prefect_server, tmp_path):
    import popflow
    from popflow import run

    kwargs: dict[str, Any] = {
        "scheduler": ResourceChangingScheduler(FIFOScheduler(), grow_at_three),
        "metric": "cpus",
        "mode": "max",
        "storage": str(tmp_path),
        "name": "resumes",
        "verbose": 0,
    }
    config = {"marker": str(tmp_path / "failed-once")}
    try:
        popflow.init(num_cpus=2)
        (first,) = run(fails_once_at_six, config, **kwargs)
        assert first.error is not None and first.metrics["training_iteration"] == 5
        kwargs["scheduler"] = ResourceChangingScheduler(FIFOScheduler(), grow_at_three)
        (second,) = run(fails_once_at_six, config, resume=True, errored="resume", **kwargs)
    finally:
        popflow.init()
    history = second.metrics_dataframe
    assert second.error is None and second.metrics["training_iteration"] == 8
    assert list(history["cpus"]) == [1.0] * 3 + [2.0] * 5  # iterations 6-8 resumed on 2
