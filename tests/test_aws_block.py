"""S3 credentials from prefect-aws blocks saved on a real Prefect server, used on moto's S3
server: the options a block gives, the deployable flow run with only the block's name as a
parameter, and the examples' ``--storage-options``/``--credentials-block`` flags.

The test process has no AWS credentials of its own (``no_ambient_credentials``), so a
write that succeeds used the block's: moto accepts any key, but botocore sends none
it cannot find.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid

import pytest
from prefect_aws import AwsClientParameters, AwsCredentials, MinIOCredentials, S3Bucket

from popflow.flows.experiment.opening import is_finished
from popflow.infra.storage.aws_blocks import (
    block_name,
    options_of,
    storage_options_from_block,
    storage_url_from_block,
)
from popflow.infra.storage.folder import Storage, StorageError
from popflow.infra.storage.options_cli import (
    add_storage_arguments,
    merge_options,
    resolve_storage_options,
    storage_options_from_args,
)
from popflow.infra.store.commit_log import ExperimentLog

MOCK = "popflow.tune.utils.mock_trainable:MyTrainableClass"
KEY = f"AKIA{uuid.uuid4().hex[:16].upper()}"  # moto accepts any key: these are the block's
SECRET = f"block-secret-{uuid.uuid4().hex}"
TOKEN = f"block-token-{uuid.uuid4().hex}"


@pytest.fixture
def no_ambient_credentials(monkeypatch, tmp_path):
    """No credentials from the environment, AWS files or instance metadata in this process."""
    for var in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def moto_credentials(endpoint: str) -> AwsCredentials:
    return AwsCredentials(
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        aws_session_token=TOKEN,
        region_name="us-east-1",
        aws_client_parameters=AwsClientParameters(endpoint_url=endpoint),
    )


def expected_options(endpoint: str) -> dict:
    return {
        "key": KEY,
        "secret": SECRET,
        "token": TOKEN,
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }


@pytest.fixture
def credentials_block(prefect_server, s3_server) -> str:
    """An AwsCredentials block for moto's server, saved on the Prefect server; its name."""
    endpoint, _ = s3_server
    name = f"moto-{uuid.uuid4().hex[:8]}"
    moto_credentials(endpoint).save(name)
    return name


@pytest.mark.integration
def test_a_credentials_block_gives_the_options_that_open_s3(
    no_ambient_credentials, credentials_block, s3_server, s3_url
):
    endpoint, fixture_options = s3_server
    # without credentials this process cannot write: what follows used the block's
    bare = Storage(s3_url, {"client_kwargs": {"endpoint_url": endpoint}})
    with pytest.raises(StorageError, match="NoCredentialsError"):
        bare.write_text("x", "denied.txt")

    options = storage_options_from_block(credentials_block)
    assert options == expected_options(endpoint)
    assert storage_options_from_block(f"aws-credentials/{credentials_block}") == options
    storage = Storage(s3_url, options)
    storage.write_text("from the block", "a", "b.txt")
    assert storage.read_text("a", "b.txt") == "from the block"
    assert SECRET not in repr(storage)
    # on moto's S3 itself, read with the fixture's own (other) keys
    assert Storage(s3_url, fixture_options).read_text("a", "b.txt") == "from the block"


@pytest.mark.integration
def test_an_s3_bucket_block_gives_its_url_and_its_credentials(
    no_ambient_credentials, prefect_server, s3_server, s3_bucket
):
    endpoint, fixture_options = s3_server
    folder = f"bucket-block-{uuid.uuid4().hex[:8]}"
    name = f"moto-bucket-{uuid.uuid4().hex[:8]}"
    S3Bucket(
        bucket_name=s3_bucket, bucket_folder=f"{folder}/", credentials=moto_credentials(endpoint)
    ).save(name)

    url = storage_url_from_block(f"s3-bucket/{name}")
    assert url == f"s3://{s3_bucket}/{folder}"
    options = storage_options_from_block(f"s3-bucket/{name}")
    assert options == expected_options(endpoint)
    Storage(url, options).write_text("in the bucket's folder", "c.txt")
    assert Storage(f"s3://{s3_bucket}", fixture_options).read_text(folder, "c.txt") == (
        "in the bucket's folder"
    )
    # a credentials block names no bucket
    assert storage_url_from_block("some-creds", default="s3://b/p") == "s3://b/p"
    with pytest.raises(ValueError, match="holds credentials, not a bucket"):
        storage_url_from_block("aws-credentials/some-creds")


@pytest.mark.integration
def test_a_missing_block_says_how_to_create_one(prefect_server):
    missing = f"nope-{uuid.uuid4().hex[:8]}"
    with pytest.raises(ValueError, match=f"no Prefect block aws-credentials/{missing} on ") as e:
        storage_options_from_block(missing)
    assert "prefect block register -m prefect_aws" in str(e.value)
    assert f"AwsCredentials(...).save({missing!r})" in str(e.value)
    with pytest.raises(ValueError, match=f"no Prefect block s3-bucket/{missing} on "):
        storage_options_from_block(f"s3-bucket/{missing}")


@pytest.mark.unit
def test_without_prefect_aws_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "prefect_aws", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"pip install 'popflow\[aws\]'"):
        storage_options_from_block("my-creds")


@pytest.mark.integration
def test_the_deployable_flow_opens_s3_with_the_block_and_keeps_its_secrets_out_of_prefect(
    no_ambient_credentials, credentials_block, tune_env, s3_server, s3_url, monkeypatch
):
    from prefect.client.orchestration import get_client
    from prefect.logging.handlers import APILogWorker

    from popflow.flows.record import deployable

    _, fixture_options = s3_server
    monkeypatch.setenv("POPFLOW_STORAGE_ALLOWLIST", s3_url)  # the owner's storage root
    name = f"from-block-{uuid.uuid4().hex[:8]}"
    state = deployable.experiment(
        trainable=MOCK,
        param_space={"width": {"randint": [2, 20]}, "height": {"uniform": [10, 100]}},
        metric="episode_reward_mean",
        mode="max",
        num_samples=2,
        stop={"training_iteration": 2},
        storage=s3_url,
        name=name,
        seed=0,
        checkpoint_frequency=1,  # the workers write checkpoints: they got the options too
        dask_address=tune_env["dask_address"].scheduler.address,
        credentials_block=credentials_block,
        return_state=True,
    )
    out = state.result()
    assert out["finished"] and out["experiment"] == f"{s3_url}/{name}"

    experiment = Storage(out["experiment"], fixture_options)
    commit = ExperimentLog(experiment).latest()
    assert commit is not None and is_finished(commit)
    assert len(commit["trials"]) == 2
    assert any("checkpoint_" in path for path in experiment.walk_files())

    APILogWorker.drain_all(timeout=5)
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(state.state_details.flow_run_id)
        runs = client.read_flow_runs()
        logs = client.read_logs()
    assert flow_run.parameters["credentials_block"] == credentials_block
    assert flow_run.parameters["storage"] == s3_url
    stored = [json.dumps(r.parameters, default=str) for r in runs]
    stored += [log.message for log in logs]
    assert any(name in text for text in stored)  # the runs (and their subflow) were found
    for secret in (KEY, SECRET, TOKEN):
        assert not [text for text in stored if secret in text]


@pytest.mark.unit
def test_a_block_needs_s3_storage():
    with pytest.raises(ValueError, match=r"`storage` is './results': give an S3 URL"):
        resolve_storage_options("./results", None, "my-creds")
    assert resolve_storage_options("./results", None, None) is None
    assert resolve_storage_options("./results", {"auto_mkdir": True}, None) == {"auto_mkdir": True}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("my-creds", ("aws-credentials", "my-creds")),
        ("aws-credentials/my-creds", ("aws-credentials", "my-creds")),
        ("s3-bucket/data", ("s3-bucket", "data")),
        ("minio-credentials/local", ("minio-credentials", "local")),
    ],
)
def test_block_names(name, parsed):
    assert block_name(name) == parsed


@pytest.mark.unit
@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "must name a Prefect block"),
        ("secret/my-creds", r"must be '<type>/<name>' with <type> one of \['aws-credentials'"),
        ("s3-bucket/", "must be '<type>/<name>'"),
    ],
)
def test_bad_block_names_say_what_is_expected(name, message):
    with pytest.raises(ValueError, match=message):
        block_name(name)


@pytest.mark.unit
def test_block_fields_map_to_s3fs_options():
    minio = MinIOCredentials(
        minio_root_user="minio",
        minio_root_password="minio-password",
        aws_client_parameters=AwsClientParameters(
            endpoint_url="http://127.0.0.1:9000", use_ssl=False, verify=False
        ),
    )
    assert options_of(S3Bucket(bucket_name="b", credentials=minio)) == {
        "key": "minio",
        "secret": "minio-password",
        "client_kwargs": {
            "endpoint_url": "http://127.0.0.1:9000",
            "verify": False,
            "use_ssl": False,
        },
    }
    anonymous = AwsCredentials(
        profile_name="research",
        aws_client_parameters=AwsClientParameters(
            config={"signature_version": "unsigned", "retries": {"max_attempts": 3}}
        ),
    )
    assert options_of(anonymous) == {
        "profile": "research",
        "anon": True,
        "config_kwargs": {"retries": {"max_attempts": 3}},
    }
    assert options_of(AwsCredentials()) == {}  # s3fs's default: the AWS chain
    with pytest.raises(ValueError, match="sets assume_role_arn"):
        options_of(AwsCredentials(assume_role_arn="arn:aws:iam::123456789012:role/R"))


# -- the examples' command-line flags ------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="example")
    p.add_argument("--storage", default="./results")
    add_storage_arguments(p)
    return p


@pytest.mark.unit
def test_no_flags_leave_the_options_as_before():
    args = parser().parse_args([])
    assert args.storage_options is None and args.credentials_block is None
    assert storage_options_from_args(args) is None


@pytest.mark.unit
def test_storage_options_are_a_json_object():
    text = '{"client_kwargs": {"endpoint_url": "http://127.0.0.1:5000"}, "anon": true}'
    args = parser().parse_args(["--storage", "s3://b/p", "--storage-options", text])
    assert storage_options_from_args(args) == json.loads(text)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--storage-options", "{endpoint_url: 1}"], "argument --storage-options: not JSON"),
        (["--storage-options", "[1, 2]"], "is JSON list [1, 2], but must be an object"),
        (["--credentials-block", "vault/x"], "argument --credentials-block: the credentials"),
    ],
)
def test_bad_flags_are_argparse_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        parser().parse_args(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.integration
def test_explicit_options_go_over_the_blocks(
    no_ambient_credentials, credentials_block, s3_server, s3_url
):
    endpoint, _ = s3_server
    argv = ["--storage", s3_url, "--credentials-block", credentials_block]
    over = {"client_kwargs": {"region_name": "eu-west-1"}, "default_block_size": 1 << 20}
    args = parser().parse_args([*argv, "--storage-options", json.dumps(over)])
    options = storage_options_from_args(args)
    assert options == {
        **expected_options(endpoint),
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "eu-west-1"},
        "default_block_size": 1 << 20,
    }
    Storage(s3_url, options).write_text("merged", "m.txt")  # the block's keys, the CLI's size
    assert Storage(s3_url, options).read_text("m.txt") == "merged"


@pytest.mark.unit
def test_merge_leaves_its_inputs_alone():
    base = {"client_kwargs": {"region_name": "us-east-1"}}
    over = {"client_kwargs": {"endpoint_url": "http://x"}}
    assert merge_options(base, over)["client_kwargs"] == {
        "region_name": "us-east-1",
        "endpoint_url": "http://x",
    }
    assert base == {"client_kwargs": {"region_name": "us-east-1"}}
