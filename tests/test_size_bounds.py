"""Every size a user gives is bounded by what the machine has, and refused with a
message naming the argument, its value and the allowed range before anything is
written or started (issue 46, break 9: ``n_workers=10**9`` was taken, and ran out of
memory after the run's arguments were written). A count of trials may be large where
nothing is made up front (a searcher suggests one at a time)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import popflow
from popflow import Trainable, grid_search, run, uniform
from popflow.flows.spec.groups import ClusterSpec, StorageSpec
from popflow.flows.spec.ray_configs import RunConfig, TuneConfig
from popflow.flows.spec.run_spec import run_spec
from popflow.infra.cluster import dask_cluster
from popflow.infra.storage.folder import Storage
from popflow.schedulers.search import Searcher
from popflow.schedulers.search.basic_variant import with_point
from popflow.schedulers.variants import resolve_variants
from popflow.tune.search import BasicVariantGenerator

pytestmark = pytest.mark.unit

GiB = 2**30


class Stepping(Trainable):
    def step(self) -> dict[str, Any]:
        return {"score": 1.0}


@pytest.fixture
def small_machine(monkeypatch):
    """A machine of 2 cores and 4 GiB: at most 8 embedded workers (4 per core)."""
    monkeypatch.setattr(dask_cluster, "machine_cores", lambda: 2, raising=False)
    monkeypatch.setattr(dask_cluster, "machine_memory", lambda: 4 * GiB, raising=False)
    monkeypatch.setattr(dask_cluster, "_CORES", None)


def refused_before_writing(tmp_path, match: str, **kwargs: Any) -> None:
    """``run`` raises ValueError(match) and the storage holds nothing (the unit tier
    also fails the test if a worker process was started)."""
    storage = tmp_path / "results"
    with pytest.raises(ValueError, match=match):
        run(
            Stepping, storage=str(storage), name="bounded", stop={"training_iteration": 1}, **kwargs
        )
    assert not storage.exists() or not any(storage.rglob("*"))


@pytest.mark.parametrize("n", [9, 10**9])
def test_more_workers_than_the_cores_allow_are_refused(tmp_path, small_machine, n):
    refused_before_writing(
        tmp_path,
        rf"`n_workers` is {n}, but must be between 1 and 8 on this machine: .*at most 4 per "
        r"core \(2 cores\)",
        n_workers=n,
    )


def test_more_workers_than_the_memory_allows_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(dask_cluster, "machine_cores", lambda: 64)
    monkeypatch.setattr(dask_cluster, "machine_memory", lambda: GiB)  # 128 MiB a worker: 8
    refused_before_writing(
        tmp_path,
        r"`n_workers` is 9, but must be between 1 and 8 on this machine: .*128 MiB each "
        r"\(1\.0 GiB of memory\)",
        n_workers=9,
    )
    assert ClusterSpec(n_workers=8).n_workers == 8


def test_a_cluster_of_ones_own_takes_any_number(small_machine):
    # n_workers sizes the embedded cluster only; with dask_address it is not used
    assert ClusterSpec("tcp://127.0.0.1:8786", n_workers=10**9).n_workers == 10**9


def test_a_trial_bigger_than_the_machine_is_refused(tmp_path, small_machine):
    refused_before_writing(
        tmp_path,
        r"`resources_per_trial\['cpu'\]` is 3, but the embedded cluster's 1 workers offer 2 "
        r"CPU each",
        resources_per_trial={"cpu": 3},
    )
    refused_before_writing(
        tmp_path,
        r"`resources_per_trial\['cpu'\]` is 2, but the embedded cluster's 2 workers offer 1 "
        r"CPU each",
        resources_per_trial={"cpu": 2},
        n_workers=2,
    )


def test_init_bounds_its_cpus_and_gpus(small_machine, monkeypatch):
    monkeypatch.setattr(dask_cluster, "detect_gpus", lambda: 0)
    try:
        with pytest.raises(
            ValueError, match=r"`num_cpus` is 1000000000, but must be between 1 and 8"
        ):
            popflow.init(num_cpus=10**9)
        with pytest.raises(
            ValueError,
            match=r"`num_gpus` is 1000000000, but must be between 0 and 16: this machine has 0",
        ):
            popflow.init(num_gpus=10**9)
        popflow.init(num_cpus=8, num_gpus=2)  # logical GPUs, as Ray's
        assert dask_cluster.default_workers() == 8
    finally:
        popflow.init()


@pytest.mark.parametrize(
    ("space", "most"), [({"x": uniform(0, 1)}, 100_000), ({"x": grid_search([1, 2, 3, 4])}, 25_000)]
)
def test_trials_sampled_up_front_are_bounded(tmp_path, space, most):
    storage = tmp_path / "results"
    with pytest.raises(
        ValueError, match=rf"`num_samples` is 1000000000, but must be between 1 and {most} here"
    ):
        popflow.simulate(Stepping, space, num_samples=10**9, storage=str(storage))
    assert not storage.exists() or not any(storage.rglob("*"))


def test_a_searcher_takes_a_billion_samples_making_only_those_it_suggests(tmp_path):
    searcher = BasicVariantGenerator(points_to_evaluate=[{"x": 0.5}])
    spec = run_spec(
        Stepping,
        {"x": uniform(0, 1)},
        TuneConfig(metric="score", mode="max", search_alg=searcher, num_samples=10**9),
        RunConfig(name="many"),
        StorageSpec(Storage(str(tmp_path))),
    )
    assert spec.num_samples == 10**9  # a searcher's trials are made one at a time
    searcher.set_search_properties("score", "max", {"x": uniform(0, 1)}, num_samples=10**9)
    configs = [searcher.suggest(f"t{i}") for i in range(3)]
    assert configs[0] == {"x": 0.5} and all(0 <= c["x"] < 1 for c in configs)
    assert searcher.total() == 10**9


def test_a_searchers_variants_are_those_it_made_all_at_once():
    space = {"x": uniform(0, 1), "g": grid_search([1, 2])}
    searcher = BasicVariantGenerator(points_to_evaluate=[{"g": 5}], random_state=3)
    searcher.set_search_properties(None, None, space, num_samples=3)
    made = [searcher.suggest(f"t{i}") for i in range(6)]
    rng = np.random.default_rng(3)
    expected = [v.config for v in resolve_variants(with_point(space, {"g": 5}), 1, rng)]
    expected += [v.config for _ in range(2) for v in resolve_variants(space, 1, rng)]
    assert made == [*expected, Searcher.FINISHED]  # the point fills the grid: 1 + 2 * 2
    assert searcher.total() == 5
