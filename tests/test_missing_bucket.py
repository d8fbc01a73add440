"""A bucket that does not exist is a StorageError naming it, at the first storage call:
``popflow.run`` fails before the cluster or Prefect starts, and ``popflow status`` says
one line (s3fs raises it as a FileNotFoundError, which a listing read as empty)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import boto3
import pytest
from trainables import ParityTrainable

from popflow import run
from popflow.flows.api import launch
from popflow.infra.storage.folder import Storage, StorageError

BUCKET = "no-such-bucket"


class Started(AssertionError):
    """``run`` went past its checks."""


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def tripwire(*args: Any, **kwargs: Any) -> Any:
        raise Started("run() started something with storage it cannot reach")

    for started in ("ClusterStart", "PrefectRecord", "train"):
        monkeypatch.setattr(launch, started, tripwire)


def buckets(endpoint: str, options: dict[str, Any]) -> list[str]:
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=options["key"],
        aws_secret_access_key=options["secret"],
        region_name="us-east-1",
    )
    return [b["Name"] for b in client.list_buckets()["Buckets"]]


@pytest.mark.integration
def test_run_fails_first_with_a_storage_error_naming_the_bucket(s3_server, nothing_starts):
    endpoint, options = s3_server
    with pytest.raises(
        StorageError,
        match=rf"storage listdir of s3://{BUCKET}/x/exp/\.popflow failed: the bucket "
        rf"'{BUCKET}' does not exist",
    ):
        run(ParityTrainable, {"a": 1}, storage=f"s3://{BUCKET}/x", storage_options=options,
            name="exp")  # fmt: skip
    assert BUCKET not in buckets(endpoint, options)


@pytest.mark.integration
@pytest.mark.parametrize("call", ["listdir", "read", "write"])
def test_every_storage_call_names_the_missing_bucket_without_retrying(s3_server, call):
    _, options = s3_server
    storage = Storage(f"s3://{BUCKET}/x", options)
    calls = {
        "listdir": lambda: storage.listdir("a"),
        "read": lambda: storage.read_bytes("a"),
        "write": lambda: storage.write_bytes(b"1", "a"),
    }
    with pytest.raises(StorageError, match=rf"the bucket '{BUCKET}' does not exist") as info:
        calls[call]()
    assert "gave up after" not in str(info.value)  # a bucket does not appear on a retry


@pytest.mark.integration
def test_a_missing_file_in_a_bucket_that_exists_is_still_no_error(s3_server, s3_url):
    _, options = s3_server
    storage = Storage(s3_url, options)
    assert storage.listdir("nothing") == []
    with pytest.raises(FileNotFoundError):
        storage.read_bytes("nothing")


@pytest.mark.system
def test_popflow_status_says_one_line(s3_server) -> None:
    _, options = s3_server
    out = subprocess.run(
        [sys.executable, "-m", "popflow.flows.api.cli", "status", f"s3://{BUCKET}/x",
         "--storage-options", json.dumps(options)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stdout == "" and "Traceback" not in out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith(
        f"popflow: storage listdir of s3://{BUCKET}/x/.popflow/commits failed: the bucket "
        f"'{BUCKET}' does not exist"
    )
    assert "testing" not in line  # the credentials stay out of it
