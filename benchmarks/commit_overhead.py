"""Overhead of durable rounds, local disk vs moto's S3 server (issue target: <= 10 % of a 1 s round).

a. End to end: synchronous PBT with 8 members on 2 workers, each step 0.25 s
   of (sleeping) training and a 1 MB checkpoint, so a round trains for 1 s;
   every round publishes 8 checkpoints and a durable commit, and retention
   deletes old ones. The same run on tmpfs (/dev/shm: storage that costs
   next to nothing), on local disk and on moto's S3 server; a round's
   durability overhead = its median wall on that storage - on tmpfs.
b. The storage operations of one such round on their own, in one process:
   8 checkpoint publishes (data, then manifest with SHA-256), 16 appends to
   derived logs, one durable commit JSON; serial and 8 threads.

Starts moto's S3 server and a Prefect server on 127.0.0.1 itself.

    .venv/bin/python benchmarks/commit_overhead.py [--rounds 12] [--ops-rounds 20]
"""

from __future__ import annotations

import argparse
import itertools
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import CommitRecorder, PrefectServer, write_json

from popflow.infra.storage.folder import Storage
from popflow.infra.store.checkpoints import fetch_checkpoint, publish_checkpoint
from popflow.tasks import Trainable

logger = logging.getLogger("overhead")
MEMBERS = 8
SIZE = 1 << 20
WORKERS = 2
STEP_S = 0.25  # 8 members x 0.25 s on 2 workers: a 1 s round
TARGET = 0.10


def member_weights() -> bytes:
    """SIZE bytes, resident in memory (drawing 100 MB from os.urandom took 0.3 s a
    build, the benchmark's cost, not popflow's; nothing on the path compresses)."""
    return b"\x01" * SIZE


class OneSecondRound(Trainable):
    """Trains 0.25 s per step (sleeping, as a GPU step leaves the CPU free); a 1 MB checkpoint."""

    def setup(self, config: dict) -> None:
        self.weights = member_weights()
        self.score = 0.0

    def step(self) -> dict:
        time.sleep(STEP_S)
        self.score += self.config["c"]
        return {"score": self.score}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "weights.bin"), "wb") as f:
            f.write(self.weights)
        with open(os.path.join(checkpoint_dir, "score.txt"), "w") as f:
            f.write(repr(self.score))

    def load_checkpoint(self, checkpoint: str) -> None:
        with open(os.path.join(checkpoint, "weights.bin"), "rb") as f:
            self.weights = f.read()
        with open(os.path.join(checkpoint, "score.txt")) as f:
            self.score = float(f.read())

    def reset_config(self, new_config: dict) -> bool:
        self.config = new_config
        return True


def round_seconds() -> float:
    """The training in one round: each worker trains its share of the members one step."""
    return STEP_S * MEMBERS / WORKERS


def tune_rounds(storage: str, options: dict | None, rounds: int, client: object) -> list[float]:
    """Run the 1 s-round PBT experiment; the wall time of each round (from the commit log)."""
    from popflow import CheckpointConfig, run
    from popflow.schedulers import PopulationBasedTraining

    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=1,
        hyperparam_mutations={"c": [1, 2, 3]},
        synch=True,
    )
    with CommitRecorder() as commits:
        run(
            OneSecondRound,
            param_space={},
            scheduler=pbt,
            metric="score",
            mode="max",
            num_samples=MEMBERS,
            stop={"training_iteration": rounds},
            checkpoint_config=CheckpointConfig(checkpoint_frequency=1, num_to_keep=2),
            storage=storage,
            storage_options=options,
            name="rounds",
            seed=0,
            dask_address=client,
        )
    # round 1 includes set-up; the seal (a last commit after the final round, with no
    # results) is no round
    times, results = commits.times, commits.results
    return [
        b - a for (a, b), n in zip(itertools.pairwise(times[1:]), results[2:], strict=True) if n
    ]


def end_to_end(options: dict, rounds: int, work: str) -> dict:
    from popflow.infra.cluster.dask_cluster import dask_client

    places = {
        "tmpfs": (tempfile.mkdtemp(prefix="popflow-overhead-", dir="/dev/shm"), None),
        "local disk": (os.path.join(work, "e2e"), None),
        "s3 (moto)": ("s3://bench/e2e", options),
    }
    walls: dict[str, float] = {}
    peaks: dict[str, list[float]] = {}
    for name, (url, opts) in places.items():
        # a cluster each: the workers' peak memory is that storage's
        with dask_client(None, WORKERS) as client:
            tune_rounds(places["tmpfs"][0] + f"-warmup-{len(walls)}", None, 2, client)
            walls[name] = statistics.median(tune_rounds(url, opts, rounds, client))
            peaks[name] = sorted(client.run(peak_rss_mib).values())
    shutil.rmtree(places["tmpfs"][0], ignore_errors=True)
    for i in range(len(places)):
        shutil.rmtree(places["tmpfs"][0] + f"-warmup-{i}", ignore_errors=True)
    base = walls["tmpfs"]
    live = MEMBERS // WORKERS * SIZE / (1 << 20)
    logger.info("a. end to end, %d rounds, median round wall; workers' peak RSS (their "
                "members' live state alone: %.0f MiB each):", rounds, live)  # fmt: skip
    for name, wall in walls.items():
        extra = wall - base
        logger.info(
            "   %-11s %6.3f s   overhead vs tmpfs %6.1f ms = %5.1f %% of the round's training"
            "   peak RSS %s MiB",
            name,
            wall,
            extra * 1e3,
            extra * 100 / round_seconds(),
            " / ".join(f"{p:.0f}" for p in peaks[name]),
        )
    return {
        name: {"round_wall_s": wall, "overhead_vs_tmpfs_s": wall - base,
               "worker_peak_rss_mib": peaks[name]}
        for name, wall in walls.items()
    }  # fmt: skip


def peak_rss_mib() -> float:
    """This process's peak resident memory (run on each worker)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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
    global SIZE, STEP_S
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=12, help="end-to-end rounds")
    parser.add_argument("--ops-rounds", type=int, default=20, help="storage-only rounds")
    parser.add_argument(
        "--size-mb",
        type=float,
        default=SIZE / (1 << 20),
        help="each member's checkpoint (and live state), MiB",
    )
    parser.add_argument(
        "--step-s",
        type=float,
        default=STEP_S,
        help="training per step; a round is 4 steps per worker",
    )
    args = parser.parse_args()
    SIZE, STEP_S = int(args.size_mb * (1 << 20)), args.step_s
    logger.info("%d members, %.0f MiB checkpoints, rounds of %.2f s of training",
                MEMBERS, SIZE / (1 << 20), STEP_S * MEMBERS / WORKERS)  # fmt: skip
    work = tempfile.mkdtemp(prefix="popflow-overhead-")
    srcs = []
    for i in range(MEMBERS):
        d = os.path.join(work, f"src{i}")
        os.makedirs(d)
        with open(os.path.join(d, "model.bin"), "wb") as f:
            f.write(os.urandom(SIZE))
        srcs.append(d)
    proc, options = start_moto()
    figures: dict = {}
    try:
        with PrefectServer() as server:  # open to the end: Prefect's log handler flushes at exit
            os.environ.update(server.client_env())
            figures["end_to_end"] = end_to_end(options, args.rounds, work)
            logger.info("b. storage operations of one round, median of %d:", args.ops_rounds)
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
                "of training",
            )
            for name, make in backends.items():
                for parallel in (False, True):
                    tag = f"{'par' if parallel else 'seq'}"
                    m = measure(make(tag), srcs, args.ops_rounds, parallel)
                    figures.setdefault("operations", {})[f"{name} {tag}"] = m
                    logger.info(
                        "%-10s %-9s %10.1f ms %7.1f ms %7.1f ms %7.1f ms %11.1f %%",
                        name,
                        "parallel" if parallel else "serial",
                        m["checkpoints"] * 1e3,
                        m["appends"] * 1e3,
                        m["commit"] * 1e3,
                        m["total"] * 1e3,
                        m["total"] * 100 / round_seconds(),
                    )
                # an exploit's read: one member's checkpoint fetched as a clone restores it
                storage = make("seq")
                fetches = []
                for i in range(3):
                    with tempfile.TemporaryDirectory() as into:
                        t0 = time.perf_counter()
                        fetch_checkpoint(storage, f"trial_{i}/checkpoint_000001", into)
                        fetches.append(time.perf_counter() - t0)
                figures.setdefault("exploit_fetch_s", {})[name] = statistics.median(fetches)
                logger.info("%-10s an exploit's fetch of one checkpoint: %.1f ms", name,
                            statistics.median(fetches) * 1e3)  # fmt: skip
            e2e = figures["end_to_end"]
            worst = max(v["overhead_vs_tmpfs_s"] for v in e2e.values())
            logger.info(
                "target: durable round overhead <= %.0f %% of the round's training: %s",
                TARGET * 100,
                "met" if worst <= TARGET * round_seconds() else "NOT met",
            )
            logger.info("figures written to %s", write_json("commit_overhead", figures))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
