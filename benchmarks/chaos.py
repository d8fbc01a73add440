"""Chaos: synch PBT and ASHA under a random mix of faults, resumed until they finish.

    python benchmarks/chaos.py [--seed 0] [--episodes 8]

Each experiment runs through ``tests/crash_driver.py`` (4 trials x 24
iterations, checkpoints every iteration, ``num_to_keep=1``) on ``flaky://``
storage, where 10 % of filesystem calls time out once or twice (driver and
workers). While a driver runs, this script injects one fault at a random
moment, then resumes (``resume="auto"``) until the experiment finishes:

- ``kill``: SIGKILL of the driver's process group (driver and its workers);
- ``stall``: SIGSTOP of the driver past its lease (3 s), a second driver
  resumes, and the first is continued (SIGCONT) while the second runs: the
  first must stop with LeaseLost;
- ``worker``: SIGKILL of one Dask worker process of the driver;
- ``disk-full`` (once per experiment): the storage sits on a 4 MB tmpfs that a
  filler file has nearly filled; the run must stop with a StorageError, and
  goes on once the filler is removed (needs root, for ``mount``).

Reported per experiment: faults injected (by kind), drivers started, objects
lost (result lines or checkpoints that an uninterrupted run has and this one
lacks; target 0) and, for synch PBT, whether the experiment equals an
uninterrupted run's (target: identical). Writes nothing into the repository.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests")
sys.path.insert(0, TESTS)
sys.path.insert(0, HERE)

from common import PrefectServer  # noqa: E402
from test_resume import read_experiment  # noqa: E402

from popflow.infra.lease import lease_holder  # noqa: E402
from popflow.infra.storage import Storage  # noqa: E402

DRIVER = os.path.join(TESTS, "crash_driver.py")
ARGS = ["--num-to-keep", "1", "--lease-ttl", "3", "--pad-bytes", "20000"]
FAULTS = ("kill", "stall", "worker")
PREFECT_URL = [""]  # the Prefect server every driver reports to (started in main)


def wait_until_holding(proc: subprocess.Popen, experiment: str) -> bool:
    """Wait until ``proc`` holds the experiment's lease (it is training); False if it
    ended first."""
    storage = Storage(experiment)
    while proc.poll() is None:
        holder = lease_holder(storage)
        if holder is not None and holder.get("pid") == proc.pid:
            return True
        time.sleep(0.05)
    return False


def start(storage: str, scheduler: str, fault_log: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "PREFECT_API_URL": PREFECT_URL[0],
        "POPFLOW_TEST_STORAGE_OPTIONS": json.dumps({"failure_rate": 0.1, "fault_log": fault_log}),
    }
    return subprocess.Popen(
        [sys.executable, DRIVER, storage, "exp", scheduler, *ARGS],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def workers_of(pid: int) -> list[int]:
    """The driver's Dask worker processes (spawned children running spawn_main)."""
    out = []
    for child in children(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                if b"spawn_main" in f.read():
                    out.append(child)
        except OSError:
            pass
    return out


def wait_for_workers(proc: subprocess.Popen) -> list[int]:
    """The driver's worker processes, once its cluster has started (it takes the lease
    first); [] if it ended before."""
    while proc.poll() is None:
        workers = workers_of(proc.pid)
        if workers:
            return workers
        time.sleep(0.05)
    return []


def run_experiment(scheduler: str, root: str, rng: random.Random, episodes: int) -> dict:
    mount = os.path.join(root, "disk")
    os.makedirs(mount)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mount], check=True)
    storage = f"flaky://{mount}/results"
    fault_log = os.path.join(root, "faults.log")
    faults: Counter[str] = Counter()
    drivers = 0
    lease_lost = 0
    try:
        filler = os.path.join(mount, "filler")
        with open(filler, "wb") as f:
            f.write(b"\0" * ((4 << 20) - (100 << 10)))  # 100 KB left
        proc = start(storage, scheduler, fault_log)
        drivers += 1
        _, err = proc.communicate(timeout=600)
        if proc.returncode == 0:
            raise AssertionError("the nearly full disk did not stop the run")
        assert "StorageError" in err, err[-2000:]
        faults["disk-full"] += 1
        os.remove(filler)
        plan = rng.sample(FAULTS * episodes, episodes)  # every kind, in a random order
        for _ in range(episodes):
            proc = start(storage, scheduler, fault_log)
            drivers += 1
            if wait_until_holding(proc, f"{mount}/results/exp"):
                time.sleep(rng.uniform(0.1, 1.2))  # a random moment of its training
            kind = plan[-1]
            workers = wait_for_workers(proc) if kind == "worker" else []
            if proc.poll() is not None:  # it ended before the fault
                _, err = proc.communicate()
                if proc.returncode == 0:
                    break
                faults["unplanned driver failure"] += 1
                print(err[-2000:], file=sys.stderr)
                continue
            plan.pop()
            if kind == "kill":
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            elif kind == "worker":
                os.kill(rng.choice(workers), signal.SIGKILL)
                proc.wait(timeout=600)
            else:  # stall past the lease, a second driver takes over, the first wakes
                os.kill(proc.pid, signal.SIGSTOP)
                while state(proc.pid) != "T":
                    time.sleep(0.01)
                holder = lease_holder(Storage(f"{mount}/results/exp"))
                if holder is not None:
                    time.sleep(max(0.0, holder["expires"] - time.time()) + 0.2)
                second = start(storage, scheduler, fault_log)
                drivers += 1
                if wait_until_holding(second, f"{mount}/results/exp"):  # it took over
                    time.sleep(rng.uniform(0.2, 2.0))
                os.kill(proc.pid, signal.SIGCONT)
                _, err = proc.communicate(timeout=600)
                lease_lost += proc.returncode != 0 and "LeaseLost" in err
                if proc.returncode == 0 or "LeaseLost" not in err:
                    print(f"stalled driver: rc {proc.returncode}\n{err[-1500:]}", file=sys.stderr)
                proc = second
                proc.wait(timeout=600)
            faults[kind] += 1
            if proc.returncode == 0:
                break
        while True:  # resume to the end, undisturbed
            proc = start(storage, scheduler, fault_log)
            drivers += 1
            _, err = proc.communicate(timeout=600)
            if proc.returncode == 0:
                break
            faults["unplanned driver failure"] += 1
            print(err[-2000:], file=sys.stderr)
        with open(fault_log) as f:
            faults["transient storage error"] = sum(1 for _ in f)
        result = read_experiment(f"{mount}/results/exp")
    finally:
        subprocess.run(["cp", "-r", f"{mount}/results", f"{root}/results"], check=False)
        subprocess.run(["umount", "-l", mount], check=False)
    return {
        "faults": dict(faults),
        "drivers": drivers,
        "stalled drivers that stopped with LeaseLost": lease_lost,
        "result": result,
    }


def reference(scheduler: str, root: str) -> dict:
    subprocess.run(
        [sys.executable, DRIVER, f"{root}/ref", "exp", scheduler, *ARGS],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return read_experiment(f"{root}/ref/exp")


def lost_objects(run: dict) -> int:
    """Result lines missing inside a trial's history (iterations must go 1, 2, 3, ...
    with no gap) and checkpoints the final commit names that do not verify."""
    lost = 0 if run["checkpoints_ok"] else 1
    for rows in run["trials"].values():
        iterations = [r["training_iteration"] for r in rows]
        lost += sum(max(0, b - a - 1) for a, b in itertools.pairwise(iterations))
        lost += iterations[0] - 1 if iterations else 0
    return lost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--episodes", type=int, default=6, help="faults per experiment, at most")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows = []
    server = PrefectServer()
    PREFECT_URL[0] = server.url
    for scheduler in ("pbt_synch", "asha"):
        with tempfile.TemporaryDirectory(prefix=f"popflow-chaos-{scheduler}-") as root:
            start_s = time.time()
            out = run_experiment(scheduler, root, rng, args.episodes)
            ref = reference(scheduler, root)
            res = out["result"]
            if scheduler == "pbt_synch" and res != ref:  # keep what went wrong to look at
                keep = f"/tmp/popflow-chaos-failed-{scheduler}"
                subprocess.run(["rm", "-rf", keep], check=False)
                subprocess.run(["cp", "-r", root, keep], check=False)
            rows.append(
                {
                    "scheduler": scheduler,
                    "faults": out["faults"],
                    "drivers started": out["drivers"],
                    "stalled drivers stopped by LeaseLost": out[
                        "stalled drivers that stopped with LeaseLost"
                    ],
                    "all trials terminated": set(res["status"]) == {"TERMINATED"},
                    "objects lost": lost_objects(res),
                    "identical to an uninterrupted run": res == ref,
                    "wall s": round(time.time() - start_s, 1),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    server.close()
    print()
    for row in rows:
        identical = row["identical to an uninterrupted run"]
        note = "" if row["scheduler"] != "asha" else " (asynchronous: not expected)"
        print(
            f"{row['scheduler']}: faults {row['faults']}; {row['drivers started']} drivers; "
            f"stalled drivers stopped {row['stalled drivers stopped by LeaseLost']}; "
            f"objects lost {row['objects lost']}; identical {identical}{note}; "
            f"{row['wall s']} s"
        )


if __name__ == "__main__":
    main()
