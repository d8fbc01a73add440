"""A Dask worker SIGKILLed mid-segment: Dask reruns the segment elsewhere, nothing changes."""

from __future__ import annotations

import pytest
from trainables import WorkerKiller

from popflow import run
from popflow.schedulers import PopulationBasedTraining, sample_from
from popflow.tasks.progress import comparable

pytestmark = pytest.mark.integration


def run_with_killer(tmp_path, name: str, marker: str | None):
    values = iter([10, 20, 40])
    results = run(
        WorkerKiller,
        {"a": sample_from(lambda _: next(values)), "c": 1, "kill_at": 4, "marker": marker},
        scheduler=PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=2,
            hyperparam_mutations={"c": [1, 2]},
            synch=True,
        ),
        metric="mean_accuracy",
        mode="max",
        num_samples=3,
        stop={"training_iteration": 8},
        storage=str(tmp_path / name),
        name="exp",
        seed=1,
        n_workers=2,
    )
    return [
        (
            {k: v for k, v in r.config.items() if k != "marker"},
            [{k: v for k, v in comparable(h).items() if k != "config"} for h in r.history],
        )
        for r in results
    ]


def test_killed_worker_changes_nothing(prefect_server, tmp_path):
    marker = tmp_path / "killed"
    crashed = run_with_killer(tmp_path, "crashed", str(marker))
    assert marker.exists()  # a worker really died mid-segment
    reference = run_with_killer(tmp_path, "reference", None)
    assert crashed == reference
    assert all(len(history) == 8 for _, history in crashed)


class Counter:  # an actor's class, as a SegmentRunner
    def __init__(self) -> None:
        self.n = 0


def test_a_runner_bound_to_a_worker_that_left_is_given_up_not_waited_for():
    """Making a runner on a worker that left the cluster first (a trial took it down as
    the runners were being made): its task waits for that worker for ever; the pool asks
    the scheduler whether the worker is still there, and gives it up. A CI run hung so
    in tests/test_trial_faults.py (``actor.result()`` with no bound)."""
    from types import SimpleNamespace

    from distributed import Client, LocalCluster

    from popflow.flows.backends.dask_pool import RunnerPool, WorkerGone

    with (
        LocalCluster(n_workers=1, processes=True, threads_per_worker=1) as cluster,
        Client(cluster) as client,
    ):
        (alive,) = client.scheduler_info(n_workers=-1)["workers"]
        made = client.submit(Counter, actor=True, workers=[alive], pure=False)
        assert RunnerPool._made(SimpleNamespace(client=client), alive, made) is not None
        gone = "tcp://127.0.0.1:9"  # a worker the cluster does not have (any more)
        stuck = client.submit(Counter, actor=True, workers=[gone], pure=False)
        with pytest.raises(WorkerGone, match="left before its runner was made"):
            RunnerPool._made(SimpleNamespace(client=client), gone, stuck)
