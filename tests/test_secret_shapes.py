"""Credentials are found by the name of their option and by the shape of their value
(issue 46, break 7 again): a ``connection_string`` (AccountKey=...), an
``Authorization`` header, an ``endpoint_url`` with ``user:pass@``, a ``sas_token``, an
``account_key``, a gcsfs ``token`` dict, ``X-Api-Key`` and ``Cookie`` headers, credential
and session objects survived pickling and repr under other names. Each pickles and prints
without them (a StorageOptions, a RunConfig, a Storage) and still reaches fsspec in
this process (``value``)."""

from __future__ import annotations

import pickle
import uuid

import botocore.credentials
import cloudpickle
import pytest

from popflow.infra.storage import credentials
from popflow.infra.storage.credentials import StorageOptions, redact, secret_values
from popflow.infra.storage.folder import Storage
from popflow.tune import RunConfig

pytestmark = pytest.mark.unit

SECRET = f"s3cr3t-{uuid.uuid4().hex}"


class _Session:
    """Stands for an aiobotocore session: its keys inside, under any repr."""

    __module__ = "aiobotocore.session"

    def __init__(self) -> None:
        self.key = SECRET


CASES: dict[str, dict] = {
    "connection_string": {
        "connection_string": f"DefaultEndpointsProtocol=https;AccountName=a;AccountKey={SECRET}"
    },
    "Authorization header": {"client_kwargs": {"headers": {"Authorization": f"Bearer {SECRET}"}}},
    "header list": {"client_kwargs": {"headers": [("Authorization", f"Basic {SECRET}")]}},
    "endpoint_url userinfo": {"endpoint_url": f"http://user:{SECRET}@127.0.0.1:9"},
    "proxy userinfo": {"config_kwargs": {"proxies": {"https": f"http://me:{SECRET}@proxy:3128"}}},
    "signed url": {"endpoint_url": f"https://a.blob.core.windows.net/c?sv=2022&sig={SECRET}"},
    "sas_token": {"account_name": "a", "sas_token": f"sv=2022&sig={SECRET}"},
    "account_key": {"account_name": "a", "account_key": SECRET},
    "gcsfs token dict": {
        "token": {"type": "authorized_user", "client_secret": SECRET, "x": SECRET}
    },
    "X-Api-Key and Cookie": {"headers": {"X-Api-Key": SECRET, "Cookie": f"sid={SECRET}"}},
    "custom header value": {"headers": {"X-Upstream": f"Bearer {SECRET}"}},
    "credentials object": {"credentials": botocore.credentials.Credentials("AKIA", SECRET)},
    "session object": {"session": _Session()},
    "credential object under another name": {"config": {"c": _Session()}},
}


def holders(options: dict) -> dict[str, object]:
    return {
        "StorageOptions": StorageOptions(options),
        "RunConfig": RunConfig(name="e", storage_path="/tmp/e", storage_options=options),
        "Storage": Storage("memory://bucket/e", options),
    }


@pytest.mark.parametrize("case", list(CASES))
def test_a_credential_under_any_name_pickles_and_prints_without_it(case):
    options = CASES[case]
    for name, holder in holders(options).items():
        for dumps in (pickle.dumps, cloudpickle.dumps):
            data = dumps(holder)
            assert SECRET.encode() not in data, (name, dumps)
        assert SECRET not in repr(holder) and SECRET not in str(holder), name
    kept = StorageOptions(options)
    assert kept.value == options  # fsspec still gets them here
    assert pickle.loads(pickle.dumps(kept)).value == options  # and a pickle read back here


def test_what_stays_public_and_how_it_prints():
    options = {
        "endpoint_url": f"http://user:{SECRET}@127.0.0.1:9/p?a=1&sig={SECRET}",
        "profile": "dev",
        "anon": False,
        "connection_string": f"AccountName=a;AccountKey={SECRET}",
        "client_kwargs": {
            "region_name": "eu-west-1",
            "headers": {"Accept": "json", "Cookie": "x=1"},
        },
        "config_kwargs": {"signature_version": "s3v4"},
    }
    kept = StorageOptions(options)
    assert kept.public == {
        "endpoint_url": "http://127.0.0.1:9/p?a=1",  # the endpoint, less its credentials
        "profile": "dev",
        "anon": False,
        "client_kwargs": {"region_name": "eu-west-1", "headers": {"Accept": "json"}},
        "config_kwargs": {"signature_version": "s3v4"},
    }
    assert repr(kept) == (
        "StorageOptions({'anon': False, 'client_kwargs': {'region_name': 'eu-west-1', "
        "'headers': {'Accept': 'json', 'Cookie': '***'}}, 'config_kwargs': "
        "{'signature_version': 's3v4'}, 'connection_string': '***', 'endpoint_url': "
        "'http://***@127.0.0.1:9/p?a=1&sig=***', 'profile': 'dev'})"
    )


def test_elsewhere_a_url_keeps_its_endpoint_without_its_userinfo(monkeypatch):
    data = pickle.dumps(StorageOptions({"endpoint_url": f"http://u:{SECRET}@host:9"}))
    monkeypatch.setattr(credentials, "_BY_TOKEN", {})  # a process that never learnt them
    assert pickle.loads(data).value == {"endpoint_url": "http://host:9"}


def test_messages_mask_the_secret_part_and_keep_the_host():
    options = {
        "endpoint_url": f"http://user:{SECRET}@minio.local:9",
        "client_kwargs": {"headers": {"Authorization": f"Bearer {SECRET}x"}},
        "connection_string": f"AccountName=a;AccountKey={SECRET}y",
    }
    text = f"cannot reach http://user:{SECRET}@minio.local:9; key {SECRET}y; {SECRET}x"
    masked = redact(text, secret_values(options))
    assert SECRET not in masked
    assert "minio.local:9" in masked


def test_two_credential_objects_that_print_alike_keep_their_own_values():
    class Opaque:
        __module__ = "google.auth.credentials"

        def __repr__(self) -> str:
            return "<Credentials>"

    a, b = Opaque(), Opaque()
    assert StorageOptions({"credentials": a}).value["credentials"] is a
    assert StorageOptions({"credentials": b}).value["credentials"] is b
