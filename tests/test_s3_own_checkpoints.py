"""A worker that restores a checkpoint it published to S3 itself reads no byte of it from
S3 (tasks/checkpoint_cache.py): synchronous PBT on one worker, where every exploit clones
a checkpoint that worker wrote, counted in moto's request log; the same run with the
worker's copies turned off reads them from S3, and both end the same."""

from __future__ import annotations

import glob
import os
import re
import tempfile
import uuid
from pathlib import Path

import pytest
from test_s3_tune import parity_kwargs
from trainables import ParityTrainable

from popflow import run

pytestmark = pytest.mark.integration


def checkpoint_gets(log: Path, prefix: str) -> int:
    """The GETs moto served of objects in the experiment's checkpoint folders."""
    pattern = re.compile(rf'"GET /{re.escape(prefix)}/[^ ]*/checkpoint_\d+')
    return sum(1 for line in log.read_text(errors="replace").splitlines() if pattern.search(line))


def copies() -> set[str]:
    """The workers' folders of checkpoint copies now in the temporary folder."""
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "popflow-checkpoint-cache-*")))


def pbt_on_one_worker(s3_server, s3_bucket: str, cache_bytes: str | None) -> tuple[list, str]:
    from distributed import Client, LocalCluster

    _, options = s3_server
    prefix = f"{s3_bucket}/own-{uuid.uuid4().hex[:8]}"
    env = {} if cache_bytes is None else {"POPFLOW_CHECKPOINT_CACHE_BYTES": cache_bytes}
    with (
        LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0", env=env) as lc,
        Client(lc) as client,
    ):
        results = run(
            ParityTrainable,
            **parity_kwargs(),
            storage=f"s3://{prefix}",
            storage_options=options,
            name="pbt",
            dask_address=client,
        )
    return [r.metrics["mean_accuracy"] for r in results], prefix


def test_restores_of_a_workers_own_checkpoints_read_nothing_from_s3(
    prefect_server, s3_server, s3_bucket, s3_home
):
    log = s3_home / "moto.log"
    before = copies()
    scores, prefix = pbt_on_one_worker(s3_server, s3_bucket, None)
    assert copies() == before  # the worker's copies went with its process
    assert scores == [43, 43, 43]  # every member ends as the best one, cloned twice
    own = checkpoint_gets(log, prefix)

    scores_off, prefix_off = pbt_on_one_worker(s3_server, s3_bucket, "0")
    assert scores_off == scores
    assert checkpoint_gets(log, prefix_off) >= 4  # two exploits: a manifest and a file each
    assert own == 0
