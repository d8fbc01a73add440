"""Synchronous PBT end to end on S3: Prefect flow, Dask workers, moto's S3 server; then a resume."""

from __future__ import annotations

import json
import uuid

import pytest
import s3fs
from trainables import ParityTrainable

from popflow import CheckpointConfig, run
from popflow.infra.storage.folder import Storage
from popflow.infra.store.checkpoints import fetch_checkpoint
from popflow.infra.store.commit_log import ExperimentLog
from popflow.infra.store.layout import MANIFEST
from popflow.infra.store.lease import lease_holder
from popflow.schedulers import PopulationBasedTraining, sample_from


def parity_kwargs() -> dict:
    """The parity setup of test_tune_pbt.py: 3 trials, a = 10/20/40, 3 iterations -> 43 each."""
    values = iter([10, 20, 40])
    return dict(
        param_space={"a": sample_from(lambda _: next(values)), "c": 1},
        scheduler=PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=1,
            hyperparam_mutations={"c": lambda: 1},
            synch=True,
        ),
        metric="mean_accuracy",
        mode="max",
        num_samples=3,
        stop={"training_iteration": 3},
        checkpoint_config=CheckpointConfig(checkpoint_frequency=1),
        seed=0,
    )


def lines(fs: s3fs.S3FileSystem, path: str) -> list:
    return [json.loads(line) for line in fs.cat_file(path).decode().splitlines()]


@pytest.fixture
def credentials(s3_server) -> dict:
    """The server's options with a unique (fake) secret, to look for it afterwards."""
    _, options = s3_server
    return {**options, "secret": f"sEcReT-{uuid.uuid4().hex}"}


@pytest.mark.integration
def test_synch_pbt_on_s3_then_resume_returns_the_same(
    prefect_server, dask_cluster, s3_server, s3_bucket, credentials, tmp_path
):
    _, options = s3_server
    storage = f"s3://{s3_bucket}/experiments"
    name = f"parity-{uuid.uuid4().hex[:8]}"
    where = dict(storage=storage, storage_options=credentials, name=name, dask_address=dask_cluster)
    results = run(ParityTrainable, **parity_kwargs(), **where)

    assert [r.metrics["mean_accuracy"] for r in results] == [43, 43, 43]
    assert all(r.status == "TERMINATED" and r.metrics["training_iteration"] == 3 for r in results)
    exp = f"{s3_bucket}/experiments/{name}"
    assert results.experiment_path == f"s3://{exp}"
    assert results.get_best_result().checkpoint.to_dict() == {"a": 40}  # read back from S3

    # everything is in the bucket, as another client sees it
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    glob = lines(fs, f"{exp}/pbt_global.txt")
    assert [(g[2], g[3]) for g in glob] == [(1, 1), (2, 2)]
    for r in results:
        assert r.path == f"s3://{exp}/{r.path.rsplit('/', 1)[1]}"
        trial = r.path.removeprefix("s3://")
        rows = lines(fs, f"{trial}/result.json")
        assert [row["training_iteration"] for row in rows] == [1, 2, 3]
        assert all(row["trial_id"] == r.trial_id for row in rows)
        assert len(fs.cat_file(f"{trial}/progress.csv").decode().splitlines()) == 4
        assert json.loads(fs.cat_file(f"{trial}/params.json"))["a"] in (10, 20, 40)
        for i in (1, 2, 3):
            assert fs.exists(f"{trial}/checkpoint_{i:06d}/{MANIFEST}")
    commits = sorted(fs.ls(f"{exp}/.popflow/commits"))
    first = int(commits[0].rsplit("/", 1)[1][:8])
    assert [c.rsplit("/", 1)[1] for c in commits] == [
        f"{i:08d}.json" for i in range(first, first + len(commits))
    ]
    final = ExperimentLog(Storage(f"s3://{exp}", options)).latest()
    assert final is not None and final["seq"] == first + len(commits) - 1
    assert {t["status"] for t in final["trials"]} == {"TERMINATED"}
    assert fs.exists(f"{exp}/.popflow/experiment.json")
    assert lease_holder(Storage(exp, options)) is None  # released at the end
    everything = fs.find(exp)
    assert not [p for p in everything if ".tmp-" in p or ".old-" in p]
    # every checkpoint the final commit keeps is complete and verifies
    store = Storage(storage, options).child(name)
    for t in final["trials"]:
        for c in t["checkpoints"]:
            path = f"{t['dirname']}/{c['name']}"
            meta = fetch_checkpoint(store, path, str(tmp_path / path))
            assert meta["iteration"] == c["iteration"]
    # the (fake) secret was written nowhere in the experiment
    for path in everything:
        assert credentials["secret"].encode() not in fs.cat_file(path), path

    # resuming the finished experiment returns the same results and commits nothing
    snapshot = {p: fs.cat_file(p) for p in fs.find(exp)}
    again = run(ParityTrainable, **parity_kwargs(), **where, resume=True)
    assert [r.metrics for r in again] == [r.metrics for r in results]
    assert [r.config for r in again] == [r.config for r in results]
    assert [r.checkpoint for r in again] == [r.checkpoint for r in results]
    fs.invalidate_cache()
    assert {p: fs.cat_file(p) for p in fs.find(exp)} == snapshot


@pytest.mark.integration
def test_credentials_are_not_stored_as_prefect_flow_parameters(
    prefect_server, dask_cluster, s3_bucket, credentials
):
    import anyio
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import FlowRunSort

    name = f"secret-{uuid.uuid4().hex[:8]}"
    run(
        ParityTrainable,
        {"a": 1},
        num_samples=1,
        stop={"training_iteration": 1},
        storage=f"s3://{s3_bucket}/experiments",
        storage_options=credentials,
        name=name,
        dask_address=dask_cluster,
    )

    async def stored_parameters() -> list[str]:
        async with get_client() as client:
            runs = await client.read_flow_runs(sort=FlowRunSort.EXPECTED_START_TIME_DESC)
        return [json.dumps(r.parameters, default=str) for r in runs]

    stored = anyio.run(stored_parameters)
    assert any(name in p for p in stored)  # the run was found
    assert not [p for p in stored if credentials["secret"] in p]


def _experiment_on_s3(fs: s3fs.S3FileSystem, path: str) -> dict:
    """pbt_global.txt and every trial's results (without volatile fields), read from S3."""
    from popflow.tasks.progress import comparable

    fs.invalidate_cache()
    out = {"pbt_global": fs.cat_file(f"{path}/pbt_global.txt").decode(), "trials": {}, "csv": {}}
    for entry in sorted(fs.ls(path, detail=False)):
        name = entry.rsplit("/", 1)[-1]
        if fs.exists(f"{entry}/result.json"):
            out["trials"][name] = [comparable(r) for r in lines(fs, f"{entry}/result.json")]
            out["csv"][name] = len(fs.cat_file(f"{entry}/progress.csv").decode().splitlines())
    return out


@pytest.mark.system
def test_crash_on_s3_resumes_identically_with_deferred_logs(prefect_server, s3_server, s3_bucket):
    """On S3 the derived logs are flushed every 30 s; a crash in between loses none of them."""
    import os
    import subprocess
    import sys

    from popflow.infra.store.commit_log import ExperimentLog

    here = os.path.dirname(os.path.abspath(__file__))
    _, options = s3_server
    env = {**os.environ, "POPFLOW_TEST_STORAGE_OPTIONS": json.dumps(options)}
    prefix = f"s3://{s3_bucket}/crash-{uuid.uuid4().hex[:8]}"

    def drive(storage: str, kill_at: str | None = None) -> int:
        cmd = [sys.executable, os.path.join(here, "crash_driver.py"), storage, "exp", "pbt_synch"]
        cmd += ["--kill-at", kill_at] if kill_at else []
        proc = subprocess.run(
            cmd, env=env, capture_output=True, timeout=300, start_new_session=True
        )
        assert kill_at or proc.returncode == 0, proc.stderr.decode()[-3000:]
        return proc.returncode

    assert drive(f"{prefix}/crash", kill_at="commit-after:9") != 0
    fs = s3fs.S3FileSystem(**options)
    state = ExperimentLog(Storage(f"{prefix}/crash/exp", options)).latest()
    assert state["seq"] == 9
    lagging = (
        [
            t
            for t in state["trials"]
            if len(
                fs.cat_file(f"{prefix}/crash/exp/{t['dirname']}/result.json").decode().splitlines()
            )
            < t["num_results"]
        ]
        if fs.exists(f"{prefix}/crash/exp/{state['trials'][0]['dirname']}/result.json")
        else state["trials"]
    )
    assert lagging  # the derived logs really were behind the commits when the driver died
    drive(f"{prefix}/crash")
    drive(f"{prefix}/ref")
    crashed = _experiment_on_s3(fs, f"{prefix}/crash/exp".removeprefix("s3://"))
    reference = _experiment_on_s3(fs, f"{prefix}/ref/exp".removeprefix("s3://"))
    assert crashed == reference
    assert all(n == 25 for n in crashed["csv"].values())  # header + 24 rows, none repeated
