"""Chaos: PBT, PB2, ASHA and async PBT under every kind of fault, resumed until they finish.

    python benchmarks/chaos.py [--seed 0] [--repeats 2] [--schedulers pbt_synch,...]
        [--classes kill,stall,...] [--in-order] [--failure-rate 0.1]

Each scheduler's experiments run through ``tests/crash_driver.py`` (4 trials x
60 iterations, a checkpoint every iteration, ``num_to_keep=2`` so that a
damaged checkpoint has an earlier one to fall back to, a 3 s lease) on
``flaky://`` storage on a tmpfs of its own, where 10 % of filesystem calls
time out once or twice (driver and workers). A shuffled (seeded) plan holds
every fault class ``--repeats`` times; each is injected into the running
driver at a random moment (after its first or second commit of its own, then
0-0.8 s; a resume's first commit is its takeover, before it restores its state):

- ``kill``: SIGKILL of the driver's process group (driver and its workers);
- ``stall``: SIGSTOP of the driver past its lease; 1, 2 or 3 takeovers follow
  (the drivers between die right after taking the lease), the last one runs,
  and the first is continued (SIGCONT): it must stop with LeaseLost (or its
  subclass CommitConflict: the commit it tried was taken);
- ``worker``: SIGKILL of one Dask worker process of the driver (it goes on);
- ``disk-full``: a filler leaves 0-16 KB free on the tmpfs: the driver must stop
  with a StorageError (ENOSPC); the filler is removed and a resume goes on;
- ``damaged-commit``: the driver is SIGKILLed and its newest commit torn,
  garbled or edited (never two in a row): the resume must fall back over it;
- ``damaged-checkpoint``: the driver is SIGKILLed and a byte flipped in the
  checkpoint a waiting trial restores from: the resume must fall back to its
  owner's earlier checkpoint (what the drivers said is reported);
- ``transient``: the flaky storage's timeouts, counted from its fault log.

When an experiment finishes before the plan is done, the next one starts (same
settings); one that 3 drivers in a row fail to resume is given up (reported).
Reported per scheduler: faults by class, drivers started, stalled
drivers stopped by LeaseLost, all trials terminated, results lost (iterations
missing from a trial's history, checkpoints the final commit names that do not
verify), duplicated results (an iteration logged twice, apart from async PBT's
logged exploits), identity with an uninterrupted run (synchronous schedulers),
wall seconds; a markdown table at the end and a JSON line per scheduler. A
failing scheduler's folder (storage copy, driver logs, ``events.log``: what was
injected when, the uninterrupted run in ``ref/``) is kept in /tmp. Every
process and mount it started is stopped, also on failure. Needs root (mount).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import chaos_faults as cf  # noqa: E402
from common import PrefectServer  # noqa: E402
from test_resume import read_experiment  # noqa: E402

SETTINGS = ["--num-to-keep", "2", "--lease-ttl", "3", "--pad-bytes", "20000", "--iterations", "60"]
CLASSES = ("kill", "stall", "worker", "disk-full", "damaged-commit", "damaged-checkpoint")
SYNCHRONOUS = ("pbt_synch", "pb2_synch")
SCHEDULERS = ("pbt_synch", "pb2_synch", "asha", "pbt_async")
RESUME_TRIES = 3  # failed drivers in a row after which an experiment is given up
DISK = 16 << 20  # the tmpfs: room for a few experiments' 20 KB checkpoints


class Chaos:
    """One scheduler's experiments under the fault plan."""

    def __init__(self, scheduler: str, root: str, seed: int, env: dict, rate: float) -> None:
        self.scheduler, self.root = scheduler, root
        self.rng = random.Random(f"{seed}-{scheduler}")
        self.mount = os.path.join(root, "disk")
        self.fault_log = os.path.join(root, "faults.log")
        options = {"failure_rate": rate, "fault_log": self.fault_log}
        self.env = {**env, "POPFLOW_TEST_STORAGE_OPTIONS": json.dumps(options)}
        self.faults: Counter[str] = Counter()
        self.drivers: list[cf.Driver] = []
        self.findings: list[str] = []  # what went wrong that a library fix must answer
        self.takeovers: list[int] = []
        self.lease_lost = 0
        self.damaged_commits: dict[str, set[int]] = {}  # per experiment
        # ("runN", "<trial>/<checkpoint>", the drivers started before the damage)
        self.damaged: list[tuple[str, str, int]] = []
        self.experiments = [self._experiment(1)]  # the last one is in use
        self.finished: list[str] = []
        self.unresumable: list[str] = []  # given up after RESUME_TRIES failed drivers in a row
        self.failed_in_a_row = 0
        self.current: cf.Driver | None = None

    def _experiment(self, n: int) -> str:
        return os.path.join(self.mount, f"run{n}", "exp")

    @property
    def experiment(self) -> str:
        return self.experiments[-1]

    def note(self, what: str) -> None:
        """A line in ``events.log``: what the chaos did when (to read beside the logs)."""
        with open(os.path.join(self.root, "events.log"), "a") as f:
            f.write(f"{time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d} {what}\n")

    def find(self, what: str) -> None:
        self.findings.append(what)
        self.note(f"FINDING {what}")

    def start(self, *extra: str) -> cf.Driver:
        storage = "flaky://" + os.path.dirname(self.experiment)
        cmd = [sys.executable, cf.DRIVER, storage, "exp", self.scheduler, *SETTINGS, *extra]
        log = os.path.join(self.root, "logs", f"driver-{len(self.drivers) + 1:03d}.log")
        self.drivers.append(cf.Driver(cmd, self.env, log))
        self.note(f"{log} pid {self.drivers[-1].pid} on {storage} {' '.join(extra)}")
        return self.drivers[-1]

    def ended(self, driver: cf.Driver, why: str) -> None:
        """``driver`` ended by itself: the experiment finished (the next one starts), or
        a failure to report; after RESUME_TRIES in a row the experiment is given up."""
        self.current = None
        if driver.proc.returncode != 0:
            error = cf.last_error(driver.output())
            self.find(f"{why}: {driver.log} rc {driver.proc.returncode}: {error}")
            self.failed_in_a_row += 1
            if self.failed_in_a_row < RESUME_TRIES:
                return
            self.find(f"{self.experiment} given up: {RESUME_TRIES} drivers failed in a row")
            self.unresumable.append(self.experiment)
        else:
            self.finished.append(self.experiment)
        self.failed_in_a_row = 0
        self.experiments.append(self._experiment(len(self.experiments) + 1))

    def moment(self, kind: str) -> cf.Driver | None:
        """Start a driver if none runs, wait for a random moment of its run (after its
        first or second commit, then 0-0.8 s); the driver, or None if it ended first."""
        if self.current is None or not self.current.alive():
            self.current = self.start()
        driver, exp = self.current, self.experiment
        # a kill or a stall after the driver's first commit of its own half the time: a
        # resume's takeover commit, before it restores the trials' records (a window a
        # stalled driver must not write in); else, and for the others, after its second
        # (it trains: a worker killed while the cluster starts fails the run, "Nanny
        # failed to start", and damages need checkpoints)
        own = self.rng.choice((1, 2)) if kind in ("kill", "stall") else 2
        due = max(cf.commits(exp), default=0) + own
        if kind == "damaged-commit":  # never two damaged in a row
            due = max(due, max(self.damaged_commits.get(exp, set()), default=0) + 2)
        try:
            if cf.poll(lambda: max(cf.commits(exp), default=0) >= due, driver):
                time.sleep(self.rng.uniform(0.0, 0.8))
        except TimeoutError:
            self.find(f"a driver made no commit in 300 s: {driver.log}")
            driver.kill()
        if driver.alive():
            self.failed_in_a_row = 0  # it resumed and trained
            return driver
        self.ended(driver, "a driver failed before its fault")
        return None

    def episode(self, kind: str) -> bool:
        """Inject one fault of ``kind``; False when it could not be (ask again)."""
        driver = self.moment(kind)
        if driver is None:
            return False
        commit = max(cf.commits(self.experiment), default=0)
        self.note(f"{kind} at {driver.log}, newest commit {commit}")
        if kind in ("kill", "damaged-commit", "damaged-checkpoint"):
            driver.kill()
            self.current = None
            exp = self.experiment
            if kind == "damaged-commit":
                damaged = self.damaged_commits.setdefault(exp, set())
                done = cf.damage_newest_commit(exp, self.rng, damaged)
            elif kind == "damaged-checkpoint":
                done = cf.damage_a_checkpoint(exp, self.rng)
                if done:
                    run = os.path.basename(os.path.dirname(exp))
                    self.damaged.append((run, done, len(self.drivers)))
            self.note(f"killed; damaged: {done}" if kind != "kill" else "killed")
            if kind != "kill" and not done:
                self.faults["kill (a damage found nothing to damage)"] += 1
                return False
        elif kind == "worker":
            workers = cf.workers_of(driver.pid)
            if not workers:
                return False
            worker = self.rng.choice(workers)
            os.kill(worker, signal.SIGKILL)
            self.note(f"killed worker {worker}")
        elif kind == "disk-full":
            filler = cf.fill_disk(self.mount, self.rng.randrange(16 << 10))
            self.note(f"disk filled, {os.statvfs(self.mount).f_bavail} blocks free")
            try:
                if not driver.wait(timeout=180):
                    self.find(f"a driver did not stop on a full disk: {driver.log}")
                    driver.kill()
            finally:
                os.remove(filler)
            self.current = None
            self.note(f"filler removed; the driver ended rc {driver.proc.returncode}")
            if driver.proc.returncode == 0 or not cf.is_enospc(driver.output()):
                self.ended(driver, "a full disk ended a driver without a StorageError")
                return False
        else:
            self.stall(driver, self.takeovers_next())
        self.faults[kind] += 1
        return True

    def takeovers_next(self) -> int:
        done = len(self.takeovers)
        return (1, 3, 2)[done % 3] if done < 3 else self.rng.choice((1, 2, 3))

    def stall(self, stalled: cf.Driver, takeovers: int) -> None:
        """SIGSTOP ``stalled`` past its lease; ``takeovers`` drivers take the experiment
        over in turn (all but the last die right after taking it); the first wakes."""
        exp = self.experiment
        os.kill(stalled.pid, signal.SIGSTOP)
        cf.poll(lambda: cf.stopped(stalled.pid), None)
        cf.poll(lambda: cf.holder_pid(exp) is None, None, timeout=60)  # its lease lapsed
        self.note(f"stopped {stalled.log}; its lease lapsed; {takeovers} takeovers")
        for _ in range(takeovers - 1):
            dying = self.start("--kill-at", "took-lease:0")
            if not dying.wait(timeout=300) or dying.proc.returncode != -signal.SIGKILL:
                self.find(f"a takeover driver did not die as planned: {dying.log}")
                dying.kill()
        live = self.current = self.start()
        if cf.poll(lambda: cf.holder_pid(exp) == live.pid, live):
            time.sleep(self.rng.uniform(0.2, 1.5))  # the successor trains a while
        os.kill(stalled.pid, signal.SIGCONT)
        self.note(f"continued {stalled.log}, newest commit {max(cf.commits(exp), default=0)}")
        if not stalled.wait(timeout=120):
            self.find(f"a stalled driver did not stop after waking: {stalled.log}")
            stalled.kill()
        elif stalled.proc.returncode != 0 and (
            "LeaseLost" in stalled.output() or "CommitConflict" in stalled.output()
        ):  # a CommitConflict is a LeaseLost: the commit it tried was taken
            self.lease_lost += 1
        else:
            self.find(
                f"a stalled driver ended rc {stalled.proc.returncode} without LeaseLost: "
                f"{stalled.log}"
            )
        self.takeovers.append(takeovers)

    def run(self, classes: list[str], repeats: int, in_order: bool = False) -> None:
        plan = (
            (classes * repeats)[::-1]
            if in_order
            else self.rng.sample(classes * repeats, len(classes) * repeats)
        )
        tries = 0
        while plan and tries < 4 * len(plan) + 10:
            tries += 1
            self.note(f"episode: {plan[-1]}")
            if self.episode(plan[-1]):
                self.note(f"injected: {plan.pop()}")
            else:  # another class first; this one later
                self.note(f"not injected: {plan[-1]}")
                plan.insert(0, plan.pop())
        if plan:
            self.find(f"faults not injected: {plan}")
        last = self.experiment  # resume it to the end, undisturbed
        while self.experiment == last and (self.current or cf.commits(last)):
            driver = self.current or self.start()
            if not driver.wait(timeout=600):
                self.find(f"a driver ran for 600 s undisturbed: {driver.log}")
                driver.kill()
            self.ended(driver, "an undisturbed resume failed")

    def stop_all(self) -> None:
        for left in cf.stop(self.drivers):
            self.find(left)

    def report(self, reference: dict, wall: float) -> dict:
        lost = duplicated = 0
        identical = terminated = True
        unverified: list[str] = []
        for exp in self.finished:
            result = read_experiment(exp)
            gaps, again = cf.iteration_gaps(result)
            lost, duplicated = lost + gaps, duplicated + again
            unverified += cf.unverified_checkpoints(exp)
            identical &= result == reference
            terminated &= set(result["status"]) == {"TERMINATED"}
        output = "\n".join(d.output() for d in self.drivers)
        with contextlib.suppress(FileNotFoundError), open(self.fault_log) as f:
            self.faults["transient"] = sum(1 for _ in f)
        return {
            "scheduler": self.scheduler,
            "faults": {k: self.faults[k] for k in (*CLASSES, "transient")}
            | {k: v for k, v in self.faults.items() if k not in CLASSES},
            "takeovers per stall": self.takeovers,
            "damaged commits": cf.commit_fallbacks(output, self.damaged_commits),
            "damaged checkpoints": [  # what the drivers after the damage said of it
                f"{run}/{ck}: " + cf.fallbacks("\n".join(d.output() for d in self.drivers[n:]), ck)
                for run, ck, n in self.damaged
            ],
            "experiments finished": len(self.finished),
            "experiments that could not be resumed": self.unresumable,
            "drivers started": len(self.drivers),
            "stalled drivers stopped by LeaseLost": self.lease_lost,
            "all trials terminated": terminated,
            "results lost": lost + len(unverified),
            "checkpoints that do not verify": unverified,
            "duplicated results": duplicated,
            "identical to an uninterrupted run": identical
            if self.scheduler in SYNCHRONOUS
            else "not expected",
            "findings": self.findings,
            "wall s": round(wall, 1),
        }


def reference(scheduler: str, root: str, env: dict) -> dict:
    """The experiment run once, undisturbed, on plain local storage."""
    cmd = [sys.executable, cf.DRIVER, f"{root}/ref", "exp", scheduler, *SETTINGS]
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=600)
    return read_experiment(f"{root}/ref/exp")


def one_scheduler(scheduler: str, args: argparse.Namespace, env: dict) -> dict:
    root = tempfile.mkdtemp(prefix=f"popflow-chaos-{scheduler}-")
    os.makedirs(os.path.join(root, "logs"))
    chaos = Chaos(scheduler, root, args.seed, env, args.failure_rate)
    os.makedirs(chaos.mount)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", chaos.mount], check=True)
    start = time.time()
    row: dict = {"scheduler": scheduler, "findings": ["interrupted"]}
    try:
        chaos.run(args.classes.split(","), args.repeats, args.in_order)
        chaos.stop_all()
        row = chaos.report(reference(scheduler, root, env), time.time() - start)
    except Exception:  # the benchmark's own failure: reported, the other schedulers run
        row["findings"] = [f"the benchmark failed:\n{traceback.format_exc()}"]
    finally:
        chaos.stop_all()
        subprocess.run(["cp", "-r", chaos.mount, os.path.join(root, "storage")], check=False)
        if subprocess.run(["umount", chaos.mount], check=False).returncode:
            subprocess.run(["umount", "-l", chaos.mount], check=False)  # still busy: detach
        bad = row["findings"] or row.get("results lost") or row.get("duplicated results")
        if bad or row.get("identical to an uninterrupted run") is False:
            row["kept"] = root  # to look at: storage, driver logs, fault log, reference
        else:
            shutil.rmtree(root, ignore_errors=True)
    return row


def table(rows: list[dict]) -> str:
    """The rows as a markdown table (a row whose run failed shows '?')."""
    head = [*CLASSES, "transient"]
    keys = ["drivers started", "stalled drivers stopped by LeaseLost", "all trials terminated"]
    keys += ["results lost", "duplicated results", "identical to an uninterrupted run"]
    keys += ["experiments finished", "unresumable", "wall s"]
    names = ["drivers", "LeaseLost stops", "all terminated", "lost", "duplicated"]
    names += ["identical", "experiments", "unresumable", "wall s"]
    lines = ["| scheduler | " + " | ".join([*head, *names]) + " |"]
    lines.append("|---" * (1 + len(head) + len(keys)) + "|")
    for r in rows:
        faults = [str(r.get("faults", {}).get(k, "?")) for k in head]
        if "takeovers per stall" in r:
            faults[1] += f" ({'/'.join(map(str, r['takeovers per stall']))} takeovers)"
        if "experiments that could not be resumed" in r:
            r = {**r, "unresumable": len(r["experiments that could not be resumed"])}
        cells = [r["scheduler"], *faults, *(r.get(k, "?") for k in keys)]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=2, help="faults of each class")
    parser.add_argument("--failure-rate", type=float, default=0.1, help="transient errors")
    parser.add_argument("--schedulers", default=",".join(SCHEDULERS))
    parser.add_argument("--classes", default=",".join(CLASSES), help="fault classes to plan")
    parser.add_argument("--in-order", action="store_true", help="the plan as given, unshuffled")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("chaos.py mounts a tmpfs: run it as root")
    # SIGINT (even in a background job, which starts with it ignored) and SIGTERM stop
    # the run through the finally blocks: drivers, mounts and the server are stopped
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print(f"chaos {time.strftime('%Y-%m-%d %H:%M:%S %Z')}: {' '.join(sys.argv[1:])}", flush=True)
    rows = []
    with PrefectServer() as server:
        for scheduler in args.schedulers.split(","):
            rows.append(one_scheduler(scheduler, args, server.client_env()))
            print(json.dumps(rows[-1]), flush=True)
    print()
    print(table(rows))
    for row in rows:
        for finding in row["findings"]:
            print(f"{row['scheduler']}: {finding}")
        if "kept" in row:
            print(f"{row['scheduler']}: kept {row['kept']}")


if __name__ == "__main__":
    main()
