"""Real services for the integration tests: a Prefect server, a Dask LocalCluster, moto S3."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from support.polling import wait_for

#: The suite's own Prefect home, and nothing left behind (a run that leaves a process
#: running or changes the user's ~/.prefect fails); the test tiers (a test with none or
#: two fails collection; a unit test cannot reach out); the Hypothesis profile
#: `make test-fast` loads.
pytest_plugins = ["support.leftovers", "support.tiers", "support.examples"]

HERE = os.path.dirname(os.path.abspath(__file__))

# One BLAS thread per process (set before numpy loads; the worker processes inherit it):
# the tests' processes share two cores, and BLAS threads spinning against each other
# made the Gaussian-process tests four times slower.
for _threads in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_until_answering(url: str, proc: subprocess.Popen, timeout: float, healthy: bool) -> None:
    """Poll ``url`` until the server behind it answers (``healthy``: with a 200), failing
    at once if its process ``proc`` exits (readiness, not a fixed sleep)."""

    def answers() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"the server for {url} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return not healthy or r.status == 200
        except urllib.error.HTTPError:
            return not healthy  # it answered
        except OSError:
            return False

    wait_for(answers, timeout, f"the server at {url} answering", interval_s=0.1)


def stop_server(proc: subprocess.Popen) -> None:
    """Stop a server the tests started: SIGTERM, then SIGKILL if it is still up in 30 s."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


@contextmanager
def prefect_server_process(host: str = "127.0.0.1", **settings: str) -> Iterator[tuple[str, str]]:
    """``prefect server start`` on ``host`` (127.0.0.1, or a simulated hosts' bridge) with
    its own home (and ``settings``, as environment variables), stopped by its PID on exit;
    yields its API URL and home."""
    home = tempfile.mkdtemp(prefix="popflow-prefect-")
    port = free_port(host)
    env = {
        **os.environ,
        "PREFECT_HOME": home,
        "PREFECT_SERVER_API_HOST": host,
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        **settings,
    }
    env.pop("PREFECT_API_URL", None)
    log = open(os.path.join(home, "server.log"), "wb")  # noqa: SIM115 (lives as long as the server)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prefect",
            "server",
            "start",
            "--host",
            host,
            "--port",
            str(port),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://{host}:{port}/api"
    try:
        wait_until_answering(f"{url}/health", proc, 180.0, healthy=True)
        yield url, home
    finally:
        stop_server(proc)
        log.close()


@contextmanager
def using_prefect_server(url: str, home: str) -> Iterator[str]:
    """Point this process and the subprocesses it starts at the server at ``url``, and back."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    before = {k: os.environ.get(k) for k in ("PREFECT_API_URL", "POPFLOW_TEST_PREFECT_HOME")}
    try:
        with temporary_settings(updates={PREFECT_API_URL: url}):
            os.environ["PREFECT_API_URL"] = url  # for subprocesses the tests start
            os.environ["POPFLOW_TEST_PREFECT_HOME"] = home  # where the server keeps its data
            try:
                yield url
            finally:
                from prefect.logging.handlers import APILogWorker

                APILogWorker.drain_all(timeout=5)  # ship queued logs before the server goes
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session", autouse=True)
def prefect_home(pytestconfig) -> Iterator[str]:
    """The session's ``PREFECT_HOME`` (``support.leftovers`` sets it before anything imports
    Prefect): a run on the embedded default starts popflow's local Prefect server there
    (never in the user's ``~/.prefect``), stopped at the end."""
    from support.leftovers import suite_prefect_home

    from popflow.infra import local_server

    home = suite_prefect_home(pytestconfig)
    yield str(home)
    local_server.stop(home)


@pytest.fixture(autouse=True)
def _stop_local_servers(request) -> Iterator[None]:
    """A test's scripts on the embedded default (a ``PREFECT_HOME`` under its ``tmp_path``)
    leave popflow's local Prefect server running: stopped by its PID after the test."""
    tmp = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if tmp is None:
        return
    from popflow.infra import local_server

    for record in tmp.rglob(local_server.RECORD):
        local_server.stop(record.parent)


@pytest.fixture(autouse=True)
def _commits_hold_the_trial_table(monkeypatch) -> None:
    """Every commit of a run in this process holds the driver's trial table as it is.

    A commit writes only the rows of the trials that changed since the one
    before (:mod:`popflow.flows.driver.trial_index`); a change the index missed would
    leave a stale row in storage, which this catches in every test that runs.
    """
    from popflow.flows.driver.controller import Controller
    from popflow.infra.jsonutil import jsonable

    commit, write = Controller.commit, Controller._write
    tables: dict[int, list[dict]] = {}  # id of a controller -> its table as last committed

    def checked(self: Controller, final: bool = False, hold: bool = False) -> None:
        commit(self, final, hold)
        # a held commit is written later, the next round planned meanwhile: its table now
        tables[id(self)] = jsonable([r.state() for r in self.records])
        if not hold:
            _check(self)

    def written(self: Controller, prepared) -> None:
        write(self, prepared)
        if prepared is not None and prepared.round < self.rounds:  # a held one
            _check(self)

    def _check(self: Controller) -> None:
        state = self.log.state
        assert state is not None
        table = tables[id(self)]
        digests = {(r.trial_id, c.name): c.digest for r in self.records for c in r.checkpoints}
        for t in table:  # digests of checkpoints still publishing when it was built
            for c in t["checkpoints"]:
                c["digest"] = c["digest"] or digests.get((t["trial_id"], c["name"]))
        stale = [t["trial_id"] for t, c in zip(table, state["trials"], strict=True) if t != c]
        assert not stale, f"commit {self.log.seq} holds stale rows of trials {stale}"

    monkeypatch.setattr(Controller, "commit", checked)
    monkeypatch.setattr(Controller, "_write", written)


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[str]:
    """A Prefect server for the session; the session's flows report to it."""
    with prefect_server_process() as (url, home), using_prefect_server(url, home):
        yield url


@pytest.fixture(scope="session")
def dask_cluster():
    """One LocalCluster of 2 process workers shared by the integration tests."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
    )
    client = Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


@pytest.fixture
def initialised(prefect_server, dask_cluster):
    """``popflow.init(<the test cluster>)``, as a Ray script calls ``ray.init()`` first;
    undone after the test."""
    import popflow

    popflow.init(dask_cluster)
    yield dask_cluster
    popflow.init()


@pytest.fixture
def tune_env(prefect_server, dask_cluster, tmp_path):
    """Keyword arguments that point ``tune`` at the test services and a fresh folder."""
    return {"dask_address": dask_cluster, "storage": str(tmp_path / "results")}


#: The bucket the ``s3_server`` fixture creates.
S3_BUCKET = "popflow-bucket"


@pytest.fixture(scope="session")
def s3_bucket() -> str:
    """Name of the bucket on the moto S3 server (see ``s3_server``)."""
    return S3_BUCKET


@pytest.fixture(scope="session")
def s3_home() -> Iterator[Path]:
    """The moto server's folder: its log, ``moto.log``, lists every request it served."""
    home = Path(tempfile.mkdtemp(prefix="popflow-moto-"))
    yield home
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def s3_server(s3_bucket: str, s3_home: Path) -> Iterator[tuple[str, dict]]:
    """moto's S3 server as a real process on 127.0.0.1 (as in s3fs's own tests), with a bucket.

    Yields ``(endpoint_url, storage_options)`` for s3fs. The credentials are
    fake (moto accepts any); AWS variables are set for the server process
    only. Dask worker processes reach the server like the driver does.
    """
    import boto3

    home = str(s3_home)
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    log = open(os.path.join(home, "moto.log"), "wb")  # noqa: SIM115 (lives as long as the server)
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_until_answering(f"{endpoint}/moto-api/", proc, 60.0, healthy=False)
        options = {
            "endpoint_url": endpoint,
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"region_name": "us-east-1"},
        }
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=options["key"],
            aws_secret_access_key=options["secret"],
            region_name="us-east-1",
        ).create_bucket(Bucket=s3_bucket)
        yield endpoint, options
    finally:
        stop_server(proc)
        log.close()


@pytest.fixture
def s3_url(s3_server, s3_bucket: str) -> str:
    """A fresh ``s3://bucket/prefix`` for one test on the shared moto server."""
    return f"s3://{s3_bucket}/test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def s3(s3_server, s3_url: str):
    """A ``Storage`` at a fresh ``s3_url``, retrying fast; removed after the test."""
    from support.s3 import FAST

    from popflow.infra.storage.folder import Storage

    _, options = s3_server
    storage = Storage(s3_url, options, retry=FAST)
    yield storage
    storage._fs = None  # a fresh client: the test may have swapped in a broken one
    storage.remove()


@pytest.fixture(scope="session")
def pbt_synch_reference(prefect_server, tmp_path_factory) -> dict:
    """What an uninterrupted crash-driver run of synchronous PBT on local disk holds (the
    driver's defaults; ``support.driving.read_experiment``): the run the kill, resume and
    fencing tests must end identical to, driven once for all of them."""
    from support.driving import drive, read_experiment

    root = tmp_path_factory.mktemp("pbt-synch-reference")
    drive(str(root), "exp", "pbt_synch")
    return read_experiment(str(root / "exp"))
