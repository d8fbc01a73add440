"""A Dask cluster shared with other work: popflow's trial slots are Dask tasks holding a
thread and the trial's resources, so other work waits for a free slot instead of
oversubscribing the workers, and the dashboard shows what popflow holds."""

from __future__ import annotations

import time
from typing import Any

import pytest

from popflow import run, tune

pytestmark = pytest.mark.integration


def three_reports(config: dict[str, Any]) -> None:
    for i in range(3):
        tune.report({"score": i})


def started_at() -> float:
    return time.time()


class Probe(tune.Callback):
    """On the driver, at the first result: what the scheduler runs, and a task of
    someone else's submitted to the same workers."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.processing: dict[str, list[str]] = {}
        self.other: Any = None
        self.last_result = 0.0

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info):
        if self.other is None:
            self.processing = {w: list(keys) for w, keys in self.client.processing().items()}
            self.other = self.client.submit(started_at, pure=False)
        self.last_result = time.time()


def test_other_work_waits_for_popflows_slots_and_the_dashboard_shows_them(
    prefect_server, dask_cluster, tmp_path
):
    probe = Probe(dask_cluster)
    grid = run(
        three_reports,
        num_samples=4,
        storage=str(tmp_path),
        name="shared",
        dask_address=dask_cluster,
        callbacks=[probe],
    )
    assert [r.status for r in grid] == ["TERMINATED"] * 4
    # every worker's one thread was held by a popflow slot task while trials ran
    assert len(probe.processing) == 2
    for keys in probe.processing.values():
        assert [k for k in keys if str(k).startswith("popflow-shared-slot-")], keys
    # so the other task did not start until the slots were given back
    assert probe.other.result(timeout=60) > probe.last_result
