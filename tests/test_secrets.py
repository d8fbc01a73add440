"""Credentials never leave with what popflow hands the user: a Checkpoint's serialised
forms (pickle, Prefect's parameters and results) carry none."""

from __future__ import annotations

import os
import pickle
import time
import uuid
from pathlib import Path

import cloudpickle

from popflow import Checkpoint

SECRET = f"s3cr3t-{uuid.uuid4().hex}"
KEY = f"AKIA{uuid.uuid4().hex[:12].upper()}"


def remote_checkpoint() -> Checkpoint:
    options = {
        "key": KEY,
        "secret": SECRET,
        "endpoint_url": "http://127.0.0.1:9",
        "client_kwargs": {"region_name": "us-east-1", "aws_session_token": SECRET},
    }
    return Checkpoint("s3://bucket/exp/trial/checkpoint_000003", options)


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
        data = path.read_bytes()
        assert SECRET.encode() not in data and KEY.encode() not in data, path
