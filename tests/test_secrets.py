"""Credentials never leave with what popflow hands the user: the serialised forms of a
Checkpoint, a Result, a ResultGrid and a History (pickle, Prefect's parameters and
results) carry none."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pickle
import time
import uuid
from pathlib import Path

import cloudpickle
import pytest
import s3fs
from trainables import ParityTrainable

from popflow import Checkpoint, CheckpointConfig, ResultGrid, grid_search, run
from popflow.infra.storage.folder import StorageError

SECRET = f"s3cr3t-{uuid.uuid4().hex}"
KEY = f"AKIA{uuid.uuid4().hex[:12].upper()}"


def remote_checkpoint() -> Checkpoint:
    options = {
        "key": KEY,
        "secret": SECRET,
        "endpoint_url": "http://127.0.0.1:9",
        "client_kwargs": {"region_name": "us-east-1", "aws_session_token": SECRET},
    }
    return Checkpoint("s3://bucket/exp/trial/checkpoint_000003", storage_options=options)


def readable_forms(data: bytes) -> list[bytes]:
    """``data`` and what it says once decoded: Prefect keeps a persisted result as
    base64 (a pickle, or JSON whose fields are), where a secret's bytes do not show."""
    forms = [data]
    with contextlib.suppress(ValueError):
        forms.append(base64.b64decode(data, validate=False))
    try:
        record = json.loads(data)
    except ValueError:
        return forms
    strings: list[str] = []

    def walk(value: object) -> None:
        if isinstance(value, str):
            strings.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(record)
    for text in strings:
        with contextlib.suppress(ValueError):
            forms.append(base64.b64decode(text, validate=True))
    return forms


@pytest.mark.unit
def test_a_pickled_checkpoint_has_no_credentials() -> None:
    ckpt = remote_checkpoint()
    for dumps in (pickle.dumps, cloudpickle.dumps):
        data = dumps(ckpt)
        assert SECRET.encode() not in data and KEY.encode() not in data
        back = pickle.loads(data)
        assert back == ckpt
        assert back.storage_options == {
            "endpoint_url": "http://127.0.0.1:9",
            "client_kwargs": {"region_name": "us-east-1"},
        }
    assert SECRET not in repr(ckpt) and ckpt.storage_options["secret"] == SECRET


@pytest.mark.integration
def test_a_checkpoint_through_a_prefect_flow_leaves_no_credentials_in_prefect(
    prefect_server,
) -> None:
    from prefect import flow

    @flow(persist_result=True)
    def restore_best(checkpoint: Checkpoint) -> Checkpoint:
        return checkpoint

    from prefect.settings import get_current_settings

    started = time.time()
    out = restore_best(remote_checkpoint())
    assert out.path == remote_checkpoint().path
    home = Path(os.environ["POPFLOW_TEST_PREFECT_HOME"])  # the server's database
    results = Path(get_current_settings().results.local_storage_path)  # the flow's result
    stored = [p for p in home.rglob("*") if p.is_file()]
    assert any(p.name.endswith(".db") for p in stored)
    persisted = [p for p in results.rglob("*") if p.is_file() and p.stat().st_mtime >= started]
    assert persisted  # the result was written where Prefect keeps results
    for path in stored + persisted:
        for data in readable_forms(path.read_bytes()):
            assert SECRET.encode() not in data and KEY.encode() not in data, path


# -- a run's results on S3: Result, ResultGrid, History ------------------------------------


def s3_grid_and_credentials(s3_server, s3_url, dask_cluster) -> tuple[ResultGrid, dict]:
    """A finished run on moto's S3 with credentials unique to this test (moto takes any)."""
    _, options = s3_server
    credentials = {**options, "key": f"AKIA{uuid.uuid4().hex[:16].upper()}", "secret": SECRET}
    grid = run(
        ParityTrainable,
        {"a": grid_search([1, 2])},
        stop={"training_iteration": 2},
        checkpoint_config=CheckpointConfig(checkpoint_frequency=1),
        metric="mean_accuracy",
        mode="max",
        storage=s3_url,
        storage_options=credentials,
        name="exp",
        dask_address=dask_cluster,
    )
    return grid, credentials


def without_credentials(monkeypatch, tmp_path) -> None:
    """No AWS credentials anywhere this process looks (and no slow metadata lookups)."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    s3fs.S3FileSystem.clear_instance_cache()  # filesystems made with other credentials


@pytest.mark.integration
def test_results_from_s3_pickle_without_credentials(
    prefect_server, dask_cluster, s3_server, s3_url, monkeypatch, tmp_path
):
    grid, credentials = s3_grid_and_credentials(s3_server, s3_url, dask_cluster)
    read_back = ResultGrid.from_path(f"{s3_url}/exp", credentials)
    best = grid.get_best_result()
    handed_out = [grid, best, best.history, read_back, read_back[1], read_back.best_checkpoint]
    for obj in handed_out:
        for dumps in (pickle.dumps, cloudpickle.dumps):
            data = dumps(obj)
            assert SECRET.encode() not in data and credentials["key"].encode() not in data, obj
    unread = pickle.dumps(read_back)  # its histories not read yet: read where unpickled
    history = [dict(r) for r in read_back[1].history]
    assert [r["training_iteration"] for r in history] == [1, 2]

    # unpickled where no credentials are to be found: the read says what is missing
    without_credentials(monkeypatch, tmp_path)
    lonely = pickle.loads(unread)
    with pytest.raises(StorageError, match="popflow pickles no credentials: give them where"):
        list(lonely[1].history)
    # where the environment has them (the AWS chain), the history loads as it was
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", credentials["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    s3fs.S3FileSystem.clear_instance_cache()
    again = pickle.loads(unread)
    assert [dict(r) for r in again[1].history] == history
    assert again[1].checkpoint.to_dict() == read_back[1].checkpoint.to_dict()


@pytest.mark.integration
def test_a_result_grid_returned_by_a_prefect_flow_leaves_no_credentials_in_prefect(
    prefect_server, dask_cluster, s3_server, s3_url
):
    from prefect import flow
    from prefect.settings import get_current_settings

    _, credentials = s3_grid_and_credentials(s3_server, s3_url, dask_cluster)

    @flow(persist_result=True)
    def read_results(path: str) -> ResultGrid:
        return ResultGrid.from_path(path, credentials)

    started = time.time()
    grid = read_results(f"{s3_url}/exp")
    assert len(grid) == 2
    home = Path(os.environ["POPFLOW_TEST_PREFECT_HOME"])  # the server's database
    results = Path(get_current_settings().results.local_storage_path)
    persisted = [p for p in results.rglob("*") if p.is_file() and p.stat().st_mtime >= started]
    assert persisted  # the grid was written where Prefect keeps results
    for path in [p for p in home.rglob("*") if p.is_file()] + persisted:
        for data in readable_forms(path.read_bytes()):
            assert SECRET.encode() not in data and credentials["key"].encode() not in data, path
