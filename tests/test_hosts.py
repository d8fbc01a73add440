"""The simulated hosts (tests/support/hosts.py): each host has its own address and its
own scratch folder, partitions and unplugged hosts drop traffic silently, Dask workers
really run on their hosts, and nothing is left behind afterwards."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support import hosts as hosts_module
from support.hosts import Hosts, start_moto, start_scheduler, start_workers
from support.processes import read, subtree

pytestmark = pytest.mark.hosts

PORT = 9000
#: A server on the host's address that accepts and closes connections.
LISTEN = """
import socket, sys
s = socket.socket()
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(64)
print("listening", flush=True)
while True:
    s.accept()[0].close()
"""
#: One connect: prints "ok" or the error's class name ("TimeoutError": nothing answered).
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("ok")
except OSError as e:
    print(type(e).__name__)
"""


def listen(hosts: Hosts, name: str) -> subprocess.Popen:
    proc = hosts.start(name, [sys.executable, "-c", LISTEN, hosts.address(name), str(PORT)])
    hosts_module.wait_ready(
        hosts, proc, lambda: "listening" in hosts.log(proc), f"listener on {name}", 30
    )
    return proc


def connect(hosts: Hosts, source: str, target: str, timeout_s: float = 1.0) -> str:
    done = hosts.run(
        source, [sys.executable, "-c", CONNECT, hosts.address(target), str(PORT), str(timeout_s)]
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def connect_from_root(address: str) -> str:
    try:
        socket.create_connection((address, PORT), timeout=1).close()
        return "ok"
    except OSError as e:
        return type(e).__name__


def netns_inode(hosts: Hosts, name: str) -> int:
    return os.stat(f"/run/netns/{hosts.namespace(name)}").st_ino


def test_hosts_reach_each_other_and_each_has_its_own_scratch(tmp_path):
    with Hosts(["a", "b"], tmp_path) as hosts:
        servers = {name: listen(hosts, name) for name in ("a", "b")}
        assert connect(hosts, "a", "b") == "ok"
        assert connect(hosts, "b", "a") == "ok"
        assert connect_from_root(hosts.address("a")) == "ok"
        assert connect_from_root(hosts.address("b")) == "ok"
        assert len({hosts.address("a"), hosts.address("b"), hosts.bridge_address}) == 3

        # the Popen's pid is the program itself, in the host's network namespace
        proc = servers["a"]
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[:2] == [sys.executable.encode(), b"-c"], cmdline
        assert os.stat(f"/proc/{proc.pid}/ns/net").st_ino == netns_inode(hosts, "a")

        write = f"open({str(hosts.SCRATCH / 'x')!r}, 'w').write('from a')"
        assert hosts.run("a", [sys.executable, "-c", write]).returncode == 0
        look = f"import os; print(os.path.exists({str(hosts.SCRATCH / 'x')!r}))"
        assert hosts.run("a", [sys.executable, "-c", look]).stdout.strip() == "True"
        assert hosts.run("b", [sys.executable, "-c", look]).stdout.strip() == "False"
        assert (hosts.scratch("a") / "x").read_text() == "from a"
        assert not (hosts.scratch("b") / "x").exists()
        assert not (hosts.SCRATCH / "x").exists()  # nothing is mounted in the root namespace


def test_a_partition_and_an_unplugged_host_drop_traffic_until_healed(tmp_path):
    with Hosts(["a", "b", "c"], tmp_path) as hosts:
        for name in ("a", "b", "c"):
            listen(hosts, name)

        hosts.partition("a", "b")
        assert connect(hosts, "a", "b") == "TimeoutError"  # dropped, not refused
        assert connect(hosts, "b", "a") == "TimeoutError"
        assert connect(hosts, "a", "c") == "ok"
        assert connect(hosts, "c", "b") == "ok"
        assert connect_from_root(hosts.address("b")) == "ok"

        hosts.down("b")
        assert connect(hosts, "c", "b") == "TimeoutError"
        assert connect(hosts, "b", "c") != "ok"  # its link is down: unreachable at once
        assert connect_from_root(hosts.address("b")) == "TimeoutError"
        assert connect(hosts, "a", "c") == "ok"
        hosts.up("b")
        assert connect(hosts, "c", "b") == "ok"
        assert connect(hosts, "b", "c") == "ok"
        assert connect(hosts, "a", "b") == "TimeoutError"  # still partitioned

        hosts.heal("a", "b")
        assert connect(hosts, "a", "b") == "ok"
        assert connect(hosts, "b", "a") == "ok"


def dead(pid: int) -> bool:
    """``pid`` is gone, or exited and waits for its subreaper (pytest) to reap it."""
    found = read(pid)
    return found is None or found.state == "Z"


def where() -> dict:
    """Run on a worker: the address its packets leave from, its network namespace, and
    what it sees in SCRATCH after writing a file of its own there."""
    from distributed import get_worker

    scratch = Path(os.environ["POPFLOW_TEST_SCRATCH"])
    worker = get_worker().address.rsplit(":", 1)[1]
    (scratch / f"seen-{worker}").write_text("")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((os.environ["POPFLOW_TEST_BRIDGE"], 9))  # UDP: sends nothing
        source = s.getsockname()[0]
    return {
        "source": source,
        "netns": os.stat("/proc/self/ns/net").st_ino,
        "scratch": sorted(p.name for p in scratch.iterdir() if p.name.startswith("seen-")),
    }


def test_dask_workers_run_on_their_own_hosts(tmp_path):
    from distributed import Client

    with Hosts(["sched", "w1", "w2"], tmp_path) as hosts:
        sched, address = start_scheduler(hosts, "sched")
        assert address.startswith(f"tcp://{hosts.address('sched')}:")
        env = {
            "POPFLOW_TEST_SCRATCH": str(hosts.SCRATCH),
            "POPFLOW_TEST_BRIDGE": hosts.bridge_address,
        }
        workers = {name: start_workers(hosts, name, address, 2, env=env) for name in ("w1", "w2")}
        with Client(address, timeout=30) as client:
            client.wait_for_workers(4, timeout=30)
            info = client.scheduler_info()["workers"]
            assert len(info) == 4
            futures = {
                w: client.submit(where, workers=[w], allow_other_workers=False, pure=False)
                for w in info
            }
            results = {w: f.result(timeout=30) for w, f in futures.items()}
            started = [p.pid for proc in hosts.started for p in subtree(proc.pid)]
        for name in ("w1", "w2"):
            mine = {
                w: r for w, r in results.items() if w.startswith(f"tcp://{hosts.address(name)}:")
            }
            assert len(mine) == 2, (name, results, hosts.tail(workers[name]))
            for w, r in mine.items():
                assert r["source"] == hosts.address(name), (w, r)
                assert r["netns"] == netns_inode(hosts, name), (w, r)
            seen = sorted(f"seen-{w.rsplit(':', 1)[1]}" for w in mine)
            assert sorted(p.name for p in hosts.scratch(name).glob("seen-*")) == seen
        assert not list(hosts.scratch("sched").glob("seen-*"))
        assert (
            json.loads((hosts.scratch("sched") / "scheduler.json").read_text())["address"]
            == address
        )
        assert sched.poll() is None
    assert started  # the nannies' worker processes, below the `dask worker` commands
    for pid in [*started, sched.pid, *(p.pid for p in workers.values())]:
        assert dead(pid), read(pid)


def ours(prefix: str) -> list[str]:
    """The namespaces and links whose names start with ``prefix``."""
    netns = json.loads(subprocess.run(["ip", "-j", "netns", "list"], capture_output=True,
                                      text=True, check=True).stdout or "[]")  # fmt: skip
    links = json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True, text=True,
                                      check=True).stdout or "[]")  # fmt: skip
    names = [n["name"] for n in netns] + [link["ifname"] for link in links]
    return [n for n in names if n.startswith(prefix)]


def mounted_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line for line in f if str(path) in line]


@pytest.mark.parametrize("body_raises", [False, True])
def test_nothing_is_left_after_the_block(tmp_path, body_raises):
    class Boom(Exception):
        pass

    hosts = Hosts(["a", "b"], tmp_path)
    with pytest.raises(Boom) if body_raises else contextlib.nullcontext(), hosts:
        procs = [hosts.start(n, ["sleep", "600"]) for n in ("a", "b")]
        assert len(ours(hosts.prefix)) == 2 + 3  # two namespaces, two veths, a bridge
        assert hosts.kill(procs[0]) == -9  # as a crash: at once, with SIGKILL
        if body_raises:
            raise Boom
    assert ours(hosts.prefix) == []
    assert mounted_under(tmp_path) == []
    assert [proc.returncode for proc in procs] == [-9, -15]  # the other one: SIGTERM
    for proc in procs:
        assert not Path(f"/proc/{proc.pid}").exists()
    hosts.close()  # again: nothing to do


def test_a_half_made_hosts_is_cleaned_up(tmp_path, monkeypatch):
    real = hosts_module._ip
    made = []

    def second_netns_fails(*args: str) -> str:
        if args[:2] == ("netns", "add"):
            made.append(args[2])
            if len(made) == 2:
                raise RuntimeError("no more namespaces")
        return real(*args)

    monkeypatch.setattr(hosts_module, "_ip", second_netns_fails)
    hosts = Hosts(["a", "b"], tmp_path)
    with pytest.raises(RuntimeError, match="no more namespaces"), hosts:
        pass
    assert ours(hosts.prefix) == []


def test_moto_on_a_host_serves_the_root_namespace_and_other_hosts(tmp_path):
    import boto3

    with Hosts(["s3", "a"], tmp_path) as hosts:
        _, endpoint = start_moto(hosts, "s3")
        assert endpoint.startswith(f"http://{hosts.address('s3')}:")
        s3 = boto3.client(
            "s3", endpoint_url=endpoint, aws_access_key_id="testing",
            aws_secret_access_key="testing", region_name="us-east-1",
        )  # fmt: skip
        s3.create_bucket(Bucket="bucket")
        put = (
            "import boto3, sys; boto3.client('s3', endpoint_url=sys.argv[1], "
            "aws_access_key_id='testing', aws_secret_access_key='testing', "
            "region_name='us-east-1').put_object(Bucket='bucket', Key='from-a', Body=b'hi')"
        )
        done = hosts.run("a", [sys.executable, "-c", put, endpoint])
        assert done.returncode == 0, done.stderr
        assert s3.get_object(Bucket="bucket", Key="from-a")["Body"].read() == b"hi"
