"""popflow on several machines, simulated: a host per network namespace on one bridge,
each with a scratch folder of its own (tests/support/hosts.py). ``dask scheduler`` on
one host, ``dask worker --nworkers 2`` on two others, moto's S3 server on another, the
driver on its own (a Prefect server on the bridge's address records its runs).

A synchronous PBT run is seeded, so whatever happens to a host it must end identical to
the run nothing happened to: every trial's iterations once each, the same scores.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import prefect_server_process
from support.hosts import TESTS, Hosts, start_moto, start_scheduler, start_workers
from support.polling import wait_for

pytestmark = pytest.mark.hosts

BUCKET = "hosts"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
POPFLOW = Path(sys.executable).with_name("popflow")
ITERATIONS = 8
#: twice the first workers' slots: a worker that joins has work to take
TRIALS = 8

DRIVER = """
import faulthandler, json, signal, sys
faulthandler.register(signal.SIGUSR1, all_threads=True)  # a hung driver's stacks, for the test
from popflow import CheckpointConfig, PopulationBasedTraining, run, tune
from trainables import HostTrainable

a = json.loads(sys.argv[1])
try:
    grid = run(
        HostTrainable,
        {"a": tune.uniform(0, 1), "c": 1, "gate": a["gate"], "gate_at": a["gate_at"],
         "sleep": a.get("sleep", 0.05)},
        scheduler=PopulationBasedTraining(
            time_attr="training_iteration", perturbation_interval=2,
            hyperparam_mutations={"c": [1, 2, 3]}, synch=True,
        ),
        metric="mean_accuracy", mode="max", num_samples=TRIALS, seed=0,
        stop={"training_iteration": ITERATIONS},
        checkpoint_config=CheckpointConfig(checkpoint_frequency=2),
        storage=a["storage"], storage_options=a.get("options"), name=a["name"],
        dask_address=a.get("dask"), n_workers=a.get("n_workers"),
        lease_ttl=a.get("lease_ttl", 60.0), verbose=1,
    )
except Exception as e:
    print("RAISED", type(e).__name__ + ":", str(e).splitlines()[0], flush=True)
    raise SystemExit(3)
print("OK", grid.num_errors, flush=True)
""".replace("ITERATIONS", str(ITERATIONS)).replace("TRIALS", str(TRIALS))


@dataclass
class Cluster:
    hosts: Hosts
    root: Path
    prefect_url: str
    endpoint: str
    scheduler: Any
    address: str
    workers: dict[str, Any] = field(default_factory=dict)
    drivers: list[Any] = field(default_factory=list)  # every driver and resume started

    @property
    def options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint, **_keys()}

    def env(self) -> dict[str, str]:
        home = self.root / "prefect-home"
        home.mkdir(exist_ok=True)
        return {
            **CREDENTIALS,
            "AWS_DEFAULT_REGION": "us-east-1",
            "PREFECT_API_URL": self.prefect_url,
            "PREFECT_HOME": str(home),
            "PYTHONPATH": str(TESTS),
        }

    def drive(self, host: str, name: str, **args: Any) -> Any:
        """The driver script on ``host``, running ``name`` (S3 and this cluster unless
        ``args`` say otherwise)."""
        args = {"storage": f"s3://{BUCKET}", "options": self.options, "dask": self.address,
                "gate": "", "gate_at": 0, "name": name, **args}  # fmt: skip
        script = self.root / "driver.py"
        script.write_text(DRIVER)
        proc = self.hosts.start(
            host, [sys.executable, script, json.dumps(args)], env=self.env(), log=f"{host}-{name}"
        )
        self.drivers.append(proc)
        return proc

    def resume(self, host: str, name: str, *more: str) -> Any:
        options = json.dumps(self.options)
        argv = [POPFLOW, "resume", f"s3://{BUCKET}/{name}", "--storage-options", options,
                "--dask-address", self.address, *more]  # fmt: skip
        proc = self.hosts.start(host, argv, env=self.env(), log=f"{host}-resume-{name}")
        self.drivers.append(proc)
        return proc

    def ended(self, proc: Any, timeout_s: float = 240.0) -> str:
        """What the driver printed, once it exited."""
        self.waiting(proc, lambda: proc.poll() is not None, timeout_s, "the driver ending")
        return self.hosts.log(proc)

    def waiting(self, proc: Any, condition: Any, timeout_s: float, what: str) -> None:
        """``wait_for(condition)``; past the deadline, the failure carries ``proc``'s log
        and the stacks of its threads (a script started by :meth:`drive`)."""
        try:
            wait_for(condition, timeout_s, what)
        except AssertionError as late:
            if proc.poll() is None and str(self.root / "driver.py") in map(str, proc.args):
                proc.send_signal(signal.SIGUSR1)
                with contextlib.suppress(AssertionError):
                    wait_for(lambda: "most recent call first" in self.hosts.log(proc), 10)
            raise AssertionError(f"{late}; its log:\n{self.hosts.log(proc)[-20000:]}") from None

    def stop_drivers(self) -> None:
        """Every driver still running stopped: a failed test's driver must not hold the
        workers' slots the next test needs."""
        for proc in self.drivers:
            self.hosts.stop(proc, timeout=5)
        self.drivers.clear()

    def start_workers(self, host: str) -> None:
        self.workers[host] = start_workers(self.hosts, host, self.address, env=self.env())


def _keys() -> dict[str, str]:
    return {"key": CREDENTIALS["AWS_ACCESS_KEY_ID"], "secret": CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("hosts")
    names = ["sched", "w1", "w2", "w3", "s3", "drv", "drv2"]
    with Hosts(names, root) as hosts, prefect_server_process(hosts.bridge_address) as (url, _):
        _, endpoint = start_moto(hosts, "s3")
        import s3fs

        s3fs.S3FileSystem(endpoint_url=endpoint, **_keys()).mkdir(BUCKET)
        scheduler, address = start_scheduler(hosts, "sched")
        made = Cluster(hosts, root, url, endpoint, scheduler, address)
        for host in ("w1", "w2"):
            made.start_workers(host)
        yield made


@pytest.fixture(autouse=True)
def _no_driver_left(cluster: Cluster) -> Iterator[None]:
    """After each test its drivers are gone and the network whole, whatever it did."""
    yield
    cluster.stop_drivers()
    cluster.hosts.heal("drv", "s3")


def _s3(cluster: Cluster) -> Any:
    import s3fs

    return s3fs.S3FileSystem(endpoint_url=cluster.endpoint, skip_instance_cache=True, **_keys())


def histories(cluster: Cluster, name: str) -> dict[str, list[tuple[Any, ...]]]:
    """Each trial's results as stored: (iteration, score, a, c) in order, and the workers."""
    fs = _s3(cluster)
    out = {}
    for path in fs.glob(f"{BUCKET}/{name}/*/result.json"):
        rows = [json.loads(line) for line in fs.cat_file(path).decode().splitlines() if line]
        trial = path.rsplit("/", 2)[1].rsplit("_", 1)[1]  # its index: ids differ by run
        out[trial] = [
            (r["training_iteration"], r["mean_accuracy"], r["a"], r["config"]["c"], r["worker"])
            for r in rows
        ]
    return out


def scores(history: dict[str, list[tuple[Any, ...]]]) -> dict[str, list[tuple[Any, ...]]]:
    """``history`` without where each result ran."""
    return {t: [row[:4] for row in rows] for t, rows in history.items()}


def every_iteration_once(history: dict[str, list[tuple[Any, ...]]]) -> bool:
    return len(history) == TRIALS and all(
        [row[0] for row in rows] == list(range(1, ITERATIONS + 1)) for rows in history.values()
    )


@pytest.fixture(scope="module")
def expected(cluster: Cluster) -> dict[str, list[tuple[Any, ...]]]:
    """The run nothing happens to, on the cluster of hosts."""
    out = cluster.ended(cluster.drive("drv", "undisturbed"))
    assert "OK 0" in out, out[-3000:]
    history = histories(cluster, "undisturbed")
    assert every_iteration_once(history), history
    return scores(history)


def at_gate(cluster: Cluster, name: str, gate_at: int = 3, **args: Any) -> tuple[Any, Path]:
    """The driver on ``drv`` running ``name``, once every trial waits at iteration
    ``gate_at``; and the gate, which lets them go on once it exists."""
    gate = cluster.root / f"gate-{name}"  # outside the scratch folders: every host sees it
    driver = cluster.drive("drv", name, gate=str(gate), gate_at=gate_at, **args)
    cluster.waiting(driver, Path(f"{gate}.reached").exists, 120, "the run reaching its gate")
    return driver, gate


def identical(cluster: Cluster, name: str, expected: dict[str, Any]) -> dict[str, Any]:
    """``name``'s stored results: every iteration once, as in the run nothing happened to."""
    history = histories(cluster, name)
    assert every_iteration_once(history) and scores(history) == expected, history
    return history


def test_an_s3_run_on_hosts_is_identical_to_a_run_on_one_host(cluster, expected):
    one = cluster.drive("drv", "one-host", dask=None, n_workers=2)
    out = cluster.ended(one)
    assert "OK 0" in out, out[-3000:]
    assert scores(histories(cluster, "one-host")) == expected
    workers = {row[4] for rows in histories(cluster, "undisturbed").values() for row in rows}
    ips = {re.match(r"tcp://([\d.]+):", w).group(1) for w in workers}
    assert ips == {cluster.hosts.address("w1"), cluster.hosts.address("w2")}


def test_a_local_folder_the_workers_do_not_see_stops_the_run_before_it_trains(cluster):
    """Before: exit 0, "4 trials, 0 errors", the checkpoints scattered over the workers'
    disks and none on the driver's."""
    storage = str(cluster.hosts.SCRATCH / "results")
    out = cluster.ended(cluster.drive("drv", "local", storage=storage, options=None))
    raised = [line for line in out.splitlines() if line.startswith("RAISED")]
    assert raised and raised[0].startswith(
        "RAISED StorageUnseen: 4 of 4 Dask workers do not see"
    ), out
    assert f"the storage {storage}/local" in raised[0] and "S3" in raised[0]
    assert "does not exist on host" in raised[0]
    for host in ("w1", "w2", "drv"):  # nothing trained: no checkpoint anywhere
        folder = cluster.hosts.scratch(host) / "results"
        assert not list(folder.rglob("checkpoint_*")), host


def test_a_worker_host_added_mid_run_gets_work_within_a_round(cluster, expected):
    """Before: the trials stayed on the workers that held them; none ran on the new host."""
    # rounds longer than the pool's look for new workers (REFRESH_INTERVAL_S)
    driver, gate = at_gate(cluster, "added", 3, sleep=0.3)
    cluster.start_workers("w3")
    gate.touch()
    out = cluster.ended(driver)
    assert "OK 0" in out, out[-3000:]
    history = identical(cluster, "added", expected)
    on_new = [
        row for rows in history.values() for row in rows if cluster.hosts.address("w3") in row[4]
    ]
    assert on_new, history


def test_a_worker_host_cut_off_and_back_costs_no_result(cluster, expected):
    driver, gate = at_gate(cluster, "cut", 3)
    cluster.hosts.down("w2")
    gate.touch()
    time.sleep(10)  # the fault's length (not a wait for anything): the host is out this long
    cluster.hosts.up("w2")
    out = cluster.ended(driver)
    assert "OK 0" in out, out[-3000:]
    identical(cluster, "cut", expected)


def test_a_driver_partitioned_from_s3_for_less_than_its_lease_rides_it_out(cluster, expected):
    driver, gate = at_gate(cluster, "blip", 3, lease_ttl=45)
    cluster.hosts.partition("drv", "s3")
    gate.touch()
    # cut off until the driver meets the outage (its first retry: a connect timeout, 5 s,
    # or a request sent before the cut timing out, 15 s), well inside the 45 s lease; a
    # fixed length could end while a request's TCP retransmits still carry it through
    wait_for(lambda: "retrying in" in cluster.hosts.log(driver), 40, "the driver retrying")
    cluster.hosts.heal("drv", "s3")
    out = cluster.ended(driver)
    assert "OK 0" in out, out[-3000:]
    identical(cluster, "blip", expected)


def test_a_driver_cut_from_s3_for_longer_than_its_lease_stops_and_another_host_resumes(
    cluster, expected
):
    """Before: `StorageError ... (gave up after 1 attempts)`, exit 1, at 79 s."""
    driver, gate = at_gate(cluster, "outage", 3, lease_ttl=10)
    cluster.hosts.partition("drv", "s3")
    gate.touch()
    out = cluster.ended(driver, timeout_s=120)
    cluster.hosts.heal("drv", "s3")
    raised = [line for line in out.splitlines() if line.startswith("RAISED")]
    assert raised and raised[0].startswith("RAISED LeaseLost: this driver (epoch 1) lost"), out
    assert "longer than its lease (10 s)" in raised[0]
    resumed = cluster.ended(cluster.resume("drv2", "outage"))
    assert "Traceback" not in resumed, resumed[-3000:]
    identical(cluster, "outage", expected)


def test_a_driver_killed_on_one_host_is_taken_over_from_another(cluster, expected):
    driver, gate = at_gate(cluster, "takeover", 5, lease_ttl=5)
    cluster.hosts.kill(driver)
    gate.touch()
    fs = _s3(cluster)

    def lapsed() -> bool:  # another host cannot see whether that pid lives: its lease must lapse
        files = fs.glob(f"{BUCKET}/takeover/.popflow/lease/*.json")
        return all(json.loads(fs.cat_file(f))["expires"] < time.time() for f in files)

    wait_for(lapsed, 60, "the killed driver's lease lapsing")
    resumed = cluster.ended(cluster.resume("drv2", "takeover"))
    assert "Traceback" not in resumed, resumed[-3000:]
    identical(cluster, "takeover", expected)


def test_losing_the_scheduler_is_one_line_and_a_resume_once_it_is_back_is_identical(
    cluster, expected
):
    """Before: `RunFailed: KeyError: 'workers'`."""
    driver, gate = at_gate(cluster, "nosched", 5)
    old = cluster.address
    cluster.hosts.kill(cluster.scheduler)
    out = cluster.ended(driver, timeout_s=120)
    raised = [line for line in out.splitlines() if line.startswith("RAISED")]
    assert raised, out[-3000:]
    # the round it was in, and the last committed (the one before, or the one before
    # that while a round's commit waits for its checkpoints: on S3 it is written as the
    # next round trains)
    said = re.fullmatch(
        rf"RAISED SchedulerLost: the Dask scheduler at {re.escape(old)} went away in round "
        r"(\d+) \(rounds up to (\d+) are committed\); its workers closed with it: start the "
        r"scheduler and its workers again, then `popflow resume s3://hosts/nosched` \(with "
        r"--dask-address if the scheduler's address changed; what finished after round \2 "
        r"runs again\)",
        raised[0],
    )
    assert said and int(said[1]) == 3 and int(said[2]) in (1, 2), raised[0]
    # nothing else about it: no worker "died" (they went with it), no reconnect given up
    # after 30 s, no trace of the Dask client's closing
    assert "died with" not in out and "distributed.client" not in out, out[-3000:]
    assert "were not all stored" not in out, out[-3000:]  # no round lost to it first
    for proc in cluster.workers.values():  # they close with their scheduler, or are made to
        cluster.hosts.stop(proc)
    cluster.scheduler, cluster.address = start_scheduler(cluster.hosts, "sched")
    for host in list(cluster.workers):
        cluster.start_workers(host)
    gate.touch()
    resumed = cluster.ended(cluster.resume("drv", "nosched"))
    assert "Traceback" not in resumed, resumed[-3000:]
    identical(cluster, "nosched", expected)
