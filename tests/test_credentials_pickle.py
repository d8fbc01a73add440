"""Credentials never land in a pickle nor a repr (issue 46, break 7): a ``RunConfig``, a
``Tuner``, a ``Storage`` and a ``CommittedExperiment`` holding S3 credentials pickle
without them, print without them, and a RunConfig flow parameter leaves none in
Prefect's database; a run on S3 with credentials only in ``storage_options`` still
reaches S3 from its Dask workers (which get them outside every pickle)."""

from __future__ import annotations

import json
import os
import pickle
import time
import uuid
from pathlib import Path

import cloudpickle
import pytest
from test_secrets import readable_forms
from trainables import ParityTrainable

from popflow import CheckpointConfig, grid_search, run
from popflow.flows.experiment.reading import CommittedExperiment, read_committed
from popflow.infra.storage import credentials
from popflow.infra.storage.credentials import Secrets, StorageOptions
from popflow.infra.storage.folder import Storage
from popflow.tune import RunConfig, Tuner

KEY = f"AKIA{uuid.uuid4().hex[:16].upper()}"
SECRET = f"s3cr3t-{uuid.uuid4().hex}"
TOKEN = f"t0ken-{uuid.uuid4().hex}"


def options() -> dict:
    return {
        "key": KEY,
        "secret": SECRET,
        "endpoint_url": "http://127.0.0.1:9",
        "client_kwargs": {"region_name": "us-east-1", "aws_session_token": TOKEN},
    }


def holders() -> dict[str, object]:
    storage = Storage("s3://bucket/exp", options())
    rc = RunConfig(name="exp", storage_path="s3://bucket", storage_options=options())
    return {
        "RunConfig": rc,
        "Tuner": Tuner(ParityTrainable, param_space={"a": 1}, run_config=rc),
        "Storage": storage,
        "child Storage": storage.child("trial_0"),
        "CommittedExperiment": CommittedExperiment(
            storage=storage,
            name="exp",
            scheduler="FIFOScheduler",
            scheduler_state={},
            metric=None,
            mode=None,
            seed=0,
            records=(),
            commit={},
            round=0,
            finished=False,
        ),
    }


def assert_clean(data: bytes | str, what: object) -> None:
    data = data.encode() if isinstance(data, str) else data
    for secret in (KEY, SECRET, TOKEN):
        assert secret.encode() not in data, (what, secret)


@pytest.mark.unit
@pytest.mark.parametrize("name", list(holders()))
def test_a_holder_of_credentials_pickles_and_prints_without_them(name):
    obj = holders()[name]
    for dumps in (pickle.dumps, cloudpickle.dumps):
        assert_clean(dumps(obj), (name, dumps))
    assert_clean(repr(obj), name)
    assert_clean(str(obj), name)


@pytest.mark.unit
def test_storage_options_print_masked_and_give_the_credentials_only_to_their_user():
    rc = RunConfig(storage_options=options())
    assert isinstance(rc.storage_options, StorageOptions)
    assert rc.storage_options.value == options() and rc.storage_options == options()
    assert repr(rc.storage_options) == (
        "StorageOptions({'client_kwargs': {'region_name': 'us-east-1', 'aws_session_token': "
        "'***'}, 'endpoint_url': 'http://127.0.0.1:9', 'key': '***', 'secret': '***'})"
    )
    assert rc.storage_options.public == {
        "endpoint_url": "http://127.0.0.1:9",
        "client_kwargs": {"region_name": "us-east-1"},
    }
    changed = rc.storage_options.value
    changed["client_kwargs"]["aws_session_token"] = "other"  # a caller's copy, not the kept one
    assert rc.storage_options.value == options()
    with pytest.raises(TypeError, match="`storage_options` must be a dict"):
        RunConfig(storage_options="key=AKIA")


@pytest.mark.unit
def test_the_secrets_themselves_refuse_to_be_pickled():
    secrets = Secrets({"secret": SECRET})
    assert SECRET not in repr(secrets) and SECRET not in str(secrets)
    for dumps in (pickle.dumps, cloudpickle.dumps):
        with pytest.raises(TypeError, match="popflow never pickles credentials"):
            dumps(secrets)
        with pytest.raises(TypeError, match="popflow never pickles credentials"):
            dumps({"nested": [secrets]})


@pytest.mark.unit
def test_unpickled_here_the_credentials_come_back_elsewhere_they_do_not(monkeypatch):
    """In the process that holds them (a worker its driver told), a pickled Storage or
    RunConfig reads with its credentials; in another, with the environment's."""
    storage, rc = holders()["Storage"], holders()["RunConfig"]
    data = pickle.dumps((storage, rc))
    back_storage, back_rc = pickle.loads(data)
    assert back_storage.storage_options == options() and back_rc.storage_options == options()
    assert back_rc == rc
    monkeypatch.setattr(credentials, "_BY_TOKEN", {})  # a process that never learnt them
    elsewhere_storage, elsewhere_rc = pickle.loads(data)
    public = {"endpoint_url": "http://127.0.0.1:9", "client_kwargs": {"region_name": "us-east-1"}}
    assert elsewhere_storage.storage_options == public
    assert elsewhere_rc.storage_options.value == public


@pytest.mark.unit
def test_prefect_records_a_run_config_parameter_without_its_credentials():
    """What Prefect writes to its database of a flow's parameters (before: the RunConfig
    field by field, storage_options in the clear)."""
    from prefect import flow

    @flow
    def user_flow(run_config: RunConfig, storage: Storage) -> None:
        pass

    serialized = user_flow.serialize_parameters(
        {"run_config": holders()["RunConfig"], "storage": holders()["Storage"]}
    )
    assert_clean(json.dumps(serialized, default=str), serialized)


@pytest.mark.integration
def test_a_run_config_flow_parameter_leaves_no_credentials_in_prefects_database(
    prefect_server,
):
    from prefect import flow

    @flow(persist_result=True)
    def user_flow(run_config: RunConfig) -> RunConfig:
        return run_config

    rc = holders()["RunConfig"]
    assert user_flow(rc) == rc
    home = Path(os.environ["POPFLOW_TEST_PREFECT_HOME"])  # the server's database (and WAL)
    stored = [p for p in home.rglob("*") if p.is_file()]
    assert any(p.name.startswith("prefect.db") for p in stored)
    for path in stored:
        for data in readable_forms(path.read_bytes()):
            assert_clean(data, path)


@pytest.mark.integration
def test_a_run_on_s3_with_credentials_in_storage_options_reaches_s3_from_its_workers(
    prefect_server, dask_cluster, s3_server, s3_url, monkeypatch, tmp_path
):
    """The workers have no AWS variables: they write checkpoints and results with the
    credentials the driver hands them outside the segments' pickles. Then a Tuner that
    restores the experiment pickles without them and still finishes it."""
    from test_secrets import without_credentials

    _, server_options = s3_server
    creds = {**server_options, "key": KEY, "secret": SECRET}  # moto takes any
    without_credentials(monkeypatch, tmp_path)  # none in this process's environment either
    grid = run(
        ParityTrainable,
        {"a": grid_search([1, 2])},
        stop={"training_iteration": 2},
        checkpoint_config=CheckpointConfig(checkpoint_frequency=1),
        metric="mean_accuracy",
        mode="max",
        storage=s3_url,
        storage_options=creds,
        name="exp",
        dask_address=dask_cluster,
    )
    assert not grid.errors and len(grid) == 2
    experiment = read_committed(f"{s3_url}/exp", creds)
    assert experiment.finished and len(experiment.records) == 2
    assert any("checkpoint_000002" in p for p in experiment.storage.walk_files())
    assert_clean(pickle.dumps(experiment), experiment)

    tuner = Tuner.restore(f"{s3_url}/exp", ParityTrainable, storage_options=creds)
    assert_clean(cloudpickle.dumps(tuner), tuner)
    started = time.monotonic()
    again = tuner.fit()  # nothing left to run: it says so, reading S3 with the credentials
    assert len(again) == 2 and time.monotonic() - started < 120


@pytest.mark.unit
def test_a_password_in_the_storage_url_is_kept_as_a_credential():
    """``sftp://user:password@host/...``: the password moves to ``storage_options``
    (fsspec's ``password`` option), out of every repr and pickle."""
    rc = RunConfig(name="exp", storage_path=f"sftp://alice:{SECRET}@127.0.0.1:2222/exp")
    assert rc.storage_path == "sftp://alice@127.0.0.1:2222/exp"
    assert rc.storage_options.value == {"password": SECRET}
    for form in (pickle.dumps(rc), cloudpickle.dumps(rc), repr(rc), str(rc)):
        assert_clean(form, rc)
    assert pickle.loads(pickle.dumps(rc)).storage_options.value["password"] == SECRET
    # what fsspec reads from the URL, but the password, which comes as the option
    from fsspec.implementations.ftp import FTPFileSystem

    whole = FTPFileSystem._get_kwargs_from_urls(f"ftp://alice:{SECRET}@127.0.0.1:2222/exp")
    rc = RunConfig(storage_path=f"ftp://alice:{SECRET}@127.0.0.1:2222/exp")
    assert {
        **FTPFileSystem._get_kwargs_from_urls(rc.storage_path),
        **rc.storage_options.value,
    } == whole
    # percent-encoded, and one that storage_options gives too
    assert RunConfig(storage_path="ftp://a:p%40ss@h/x").storage_options.value == {
        "password": "p@ss"
    }
    same = RunConfig(storage_path="ftp://a:pw@h/x", storage_options={"password": "pw"})
    assert same.storage_options.value == {"password": "pw"}
    with pytest.raises(ValueError, match="holds a password and `storage_options` another"):
        RunConfig(storage_path="ftp://a:pw@h/x", storage_options={"password": "other"})
    assert RunConfig(storage_path="ftp://a@h/x").storage_options is None
