"""A closing embedded worker's heartbeat failure stays off the console (dask/distributed#7105);
a running worker's is still logged. CI once printed that 30-line traceback after a good run."""

from __future__ import annotations

import logging

import pytest
from distributed import LocalCluster

from popflow.infra.cluster.dask_cluster import dask_client
from popflow.infra.cluster.worker_close_logs import HEARTBEAT_FAILED, ClosingHeartbeat, dask_setup

pytestmark = pytest.mark.integration

WORKER_LOG = "distributed.worker"


def test_the_heartbeat_failure_is_dropped_only_once_its_worker_closes(caplog):
    cluster = LocalCluster(n_workers=1, processes=False, dashboard_address=":0")
    (worker,) = cluster.workers.values()
    logger = logging.getLogger(WORKER_LOG)
    filters = list(logger.filters)
    try:
        dask_setup(worker)
        with caplog.at_level(logging.ERROR, logger=WORKER_LOG):
            logger.error("%s.", HEARTBEAT_FAILED)  # a running worker: shown
            cluster.close()
            logger.error("%s.", HEARTBEAT_FAILED)  # closed: dropped
            logger.error("Unexpected exception during heartbeat. Closing worker.")  # kept
    finally:
        logger.filters[:] = filters
        cluster.close()
    errors = [r for r in caplog.records if r.name == WORKER_LOG and r.levelno >= logging.ERROR]
    assert [r.getMessage() for r in errors] == [
        f"{HEARTBEAT_FAILED}.",
        "Unexpected exception during heartbeat. Closing worker.",
    ]


def test_embedded_workers_carry_the_filter():
    def filters() -> list[str]:
        return [type(f).__name__ for f in logging.getLogger(WORKER_LOG).filters]

    with dask_client(None, 1) as client:
        (names,) = client.run(filters).values()
    assert names == [ClosingHeartbeat.__name__]
