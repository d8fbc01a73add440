"""Overhead of one durable PBT commit round, local disk vs moto's S3 server.

One round for 8 members: publish 8 checkpoints of 1 MB (data object, then
manifest with SHA-256), 16 appends to derived logs (result.json and
progress.csv per member), one durable commit JSON; as a share of a 1 s round
(issue target: <= 10 %). Starts moto's S3 server on 127.0.0.1 itself.

    .venv/bin/python benchmarks/commit_overhead.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from infra.checkpoint_store import publish_checkpoint
from infra.storage import Storage

logger = logging.getLogger("overhead")
MEMBERS = 8
SIZE = 1 << 20


def start_moto() -> tuple[subprocess.Popen, dict]:
    import socket

    import boto3

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    options = {
        "endpoint_url": endpoint,
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"region_name": "us-east-1"},
    }
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    ).create_bucket(Bucket="bench")
    return proc, options


def one_round(storage: Storage, srcs: list[str], rnd: int, parallel: bool) -> dict[str, float]:
    t0 = time.perf_counter()

    def publish(i: int) -> None:
        publish_checkpoint(storage, srcs[i], f"trial_{i}/checkpoint_{rnd:06d}", {"iteration": rnd})

    if parallel:  # as 8 Dask workers do, each its own member
        with ThreadPoolExecutor(MEMBERS) as pool:
            list(pool.map(publish, range(MEMBERS)))
    else:
        for i in range(MEMBERS):
            publish(i)
    t1 = time.perf_counter()

    def append(i: int) -> None:  # the driver's derived logs: 2 appends per member
        row = {"trial_id": f"trial_{i}", "training_iteration": rnd, "mean_accuracy": 0.5}
        storage.append_text(json.dumps(row) + "\n", f"trial_{i}", "result.json")
        storage.append_text(f"{rnd},0.5,trial_{i}\n", f"trial_{i}", "progress.csv")

    if parallel:  # one thread per member (not what the controller does today)
        with ThreadPoolExecutor(MEMBERS) as pool:
            list(pool.map(append, range(MEMBERS)))
    else:
        for i in range(MEMBERS):
            append(i)
    t2 = time.perf_counter()
    commit = {
        "round": rnd,
        "trials": [{"trial_id": f"trial_{i}", "config": {"lr": 0.01 * i}} for i in range(8)],
        "pad": "x" * 8000,  # a commit of ~10 KB
    }
    storage.write_text(json.dumps(commit), ".popflow", "commits", f"{rnd:08d}.json", durable=True)
    t3 = time.perf_counter()
    return {"checkpoints": t1 - t0, "appends": t2 - t1, "commit": t3 - t2, "total": t3 - t0}


def measure(storage: Storage, srcs: list[str], rounds: int, parallel: bool) -> dict[str, float]:
    one_round(storage, srcs, 0, parallel)  # warm-up (connections, folders)
    times = [one_round(storage, srcs, r, parallel) for r in range(1, rounds + 1)]
    return {k: statistics.median(t[k] for t in times) for k in times[0]}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="popflow-overhead-")
    srcs = []
    for i in range(MEMBERS):
        d = os.path.join(work, f"src{i}")
        os.makedirs(d)
        with open(os.path.join(d, "model.bin"), "wb") as f:
            f.write(os.urandom(SIZE))
        srcs.append(d)
    proc, options = start_moto()
    try:
        backends = {
            "local": lambda tag: Storage(os.path.join(work, f"local-{tag}")),
            "s3 (moto)": lambda tag: Storage(f"s3://bench/{tag}", options),
        }
        logger.info(
            "%-10s %-9s %12s %10s %10s %10s %12s",
            "storage",
            "publish",
            "checkpoints",
            "appends",
            "commit",
            "total",
            "of 1 s round",
        )
        for name, make in backends.items():
            for parallel in (False, True):
                tag = f"{'par' if parallel else 'seq'}"
                m = measure(make(tag), srcs, args.rounds, parallel)
                logger.info(
                    "%-10s %-9s %10.1f ms %7.1f ms %7.1f ms %7.1f ms %11.1f %%",
                    name,
                    "parallel" if parallel else "serial",
                    m["checkpoints"] * 1e3,
                    m["appends"] * 1e3,
                    m["commit"] * 1e3,
                    m["total"] * 1e3,
                    m["total"] * 100,
                )
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
