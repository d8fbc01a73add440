"""A tune driver the resume tests run as a subprocess and kill at chosen points.

    python tests/crash_driver.py STORAGE NAME SCHEDULER [--kill-at KIND:N] [--iterations 24]

``--kill-at append:3`` SIGKILLs the driver's process group (driver and its
embedded Dask workers) inside the 3rd append to a derived log,
``commit-before:N`` / ``commit-after:N`` around the N-th commit's publication,
``remove:N`` inside the N-th deletion, ``took-lease:0`` right after taking the
experiment's lease, ``cut-back:0`` right after a rewind planned to cut a trial's
result.json and progress.csv back (a damaged checkpoint's fallback, a retry), before
the commit that records it, ``cut-made:0`` right after the writer cut one back. The faults are injected here, by wrapping storage calls, not by
hooks in the library. With
``POPFLOW_TEST_KILL_RECORDED=<name>`` a kill waits until Prefect's record of the
run has caught up (a Running ``tune`` run of experiment <name> with a Running
round task in the API): the record trails the training by design.
"""

from __future__ import annotations

import argparse
import errno
import itertools
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from trainables import ParityTrainable

from popflow import CheckpointConfig, run
from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import ExperimentLog
from popflow.infra.store.lease import Lease
from popflow.schedulers import (
    PB2,
    ASHAScheduler,
    FIFOScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    PopulationBasedTraining,
    PopulationBasedTrainingReplay,
    randint,
    sample_from,
)
from popflow.tune.schedulers.hb_bohb import HyperBandForBOHB

ITERATIONS = 24


def scheduler(kind: str, iterations: int = ITERATIONS):
    return {
        "pbt_synch": lambda: PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=1,
            hyperparam_mutations={"c": [1, 2, 3]},
            synch=True,
        ),
        "pbt_async": lambda: PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=2,
            hyperparam_mutations={"c": [1, 2, 3]},
        ),
        "pb2_synch": lambda: PB2(
            time_attr="training_iteration",
            perturbation_interval=2,
            hyperparam_bounds={"c": [1, 3]},
            synch=True,
        ),
        "asha": lambda: ASHAScheduler(grace_period=1, max_t=iterations, reduction_factor=2),
        "hyperband": lambda: HyperBandScheduler(max_t=iterations, reduction_factor=2),
        "bohb": lambda: HyperBandForBOHB(max_t=iterations, reduction_factor=2),
        "median": lambda: MedianStoppingRule(
            time_attr="training_iteration", grace_period=2, min_samples_required=2
        ),
        "fifo": FIFOScheduler,
        # replays the lineage file named by $POPFLOW_TEST_POLICY (one trial)
        "replay": lambda: PopulationBasedTrainingReplay(os.environ["POPFLOW_TEST_POLICY"]),
    }[kind]()


def search_alg(kind: str | None):
    """The searcher of ``--search``: Optuna's TPE (seed 0), or BOHB's model (seed 0;
    scheduler ``bohb``), at most 2 trials live, so that most trials are suggested after
    others ended (by the model, after the first 4)."""
    if kind is None:
        return None
    from popflow.tune.search import ConcurrencyLimiter

    if kind == "bohb":
        from popflow.tune.search.bohb import TuneBOHB

        return ConcurrencyLimiter(TuneBOHB(seed=0), max_concurrent=2)
    if kind == "ax":  # seeded by the run; Sobol throughout (BoTorch's fits take tens of s)
        from ax.adapter.registry import Generators
        from ax.generation_strategy.generation_strategy import GenerationStep as Step
        from ax.generation_strategy.generation_strategy import GenerationStrategy

        from popflow.tune.search.ax import AxSearch

        sobol = Generators.SOBOL
        steps = [
            Step(generator=sobol, num_trials=4, min_trials_observed=4),
            Step(generator=sobol, num_trials=-1),
        ]
        return ConcurrencyLimiter(AxSearch(generation_strategy=GenerationStrategy(nodes=steps)), 2)
    if kind == "hebo":  # seeded by the run; Sobol for 8 trials, then one batch of HEBO's model
        from popflow.tune.search.hebo import HEBOSearch

        return ConcurrencyLimiter(HEBOSearch(rand_sample=8), 2)
    import optuna

    from popflow.tune.search.optuna import OptunaSearch

    sampler = optuna.samplers.TPESampler(n_startup_trials=4, seed=0)
    return ConcurrencyLimiter(OptunaSearch(sampler=sampler), max_concurrent=2)


def inject(kill_at: str | None) -> None:
    """Kill the process group at a point of the experiment's progress.

    ``N`` counts the experiment's commits (across resumes): ``commit-before:N``
    dies just before commit N is published, ``commit-after:N`` just after;
    ``append:N`` / ``remove:N`` die in the first derived-log append / checkpoint
    deletion after commit N (in the middle of writing round N + 1).
    """
    if not kill_at:
        return
    kind, n = kill_at.split(":")
    target = int(n)

    def die() -> None:
        recorded = os.environ.get("POPFLOW_TEST_KILL_RECORDED")
        if recorded:
            _wait_until_recorded(recorded)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    original_commit = ExperimentLog.commit
    committed = {"seq": 0}

    def commit(self, payload, **kwargs):
        # the log this driver commits to: the one whose seq the append/remove points count
        # (a resume's Prefect record reads the experiment through a log of its own)
        committed["log"] = self
        if kind == "commit-before" and self.seq + 1 == target:
            die()
        seq = original_commit(self, payload, **kwargs)
        if kind == "commit-after" and seq == target:
            die()
        if kind == "stop-after" and seq == target:  # a driver that stalls (SIGSTOP): alive, silent
            os.kill(os.getpid(), signal.SIGSTOP)
        return seq

    ExperimentLog.commit = commit
    original_latest = ExperimentLog.latest

    def latest(self):
        out = original_latest(self)
        committed.setdefault("log", self)  # before this driver's first commit: the one it read
        return out

    ExperimentLog.latest = latest

    def after_target(original):
        def wrapper(self, *args, **kwargs):
            log = committed.get("log")
            if log is not None and log.seq >= target:
                die()
            return original(self, *args, **kwargs)

        return wrapper

    if kind == "took-lease":  # dies right after taking the lease, before any commit
        original_acquire = Lease.acquire

        def acquire(self, *args, **kwargs):
            original_acquire(self, *args, **kwargs)
            die()

        Lease.acquire = acquire
    elif kind == "enospc":  # the disk fills up: a permanent storage error, no SIGKILL
        _fill_the_disk_in_appends(committed, target)
    elif kind in ("cut-back", "cut-made"):
        # dies right after a rewind planned a cut of a trial's logs (before the commit
        # that records it), or right after the writer made one (before its appends)
        from popflow.flows.experiment.trial_logs import TrialLogs

        name = "_plan_cut" if kind == "cut-back" else "_truncate"
        original_cut = getattr(TrialLogs, name)

        def cut(self, *args, **kwargs):
            out = original_cut(self, *args, **kwargs)
            die()
            return out

        setattr(TrialLogs, name, cut)
    elif kind == "append":
        Storage.append_text = after_target(Storage.append_text)
    elif kind == "stop-in-append":
        # stalls (SIGSTOP) inside the first result.json append after commit N: its lease
        # checked and the log opened, its bytes not yet written (the stale-driver break)
        _stop_inside_appends(committed, target)
    elif kind == "remove":
        Storage.remove = after_target(Storage.remove)
    elif kind not in (
        "commit-before",
        "commit-after",
        "stop-after",
        "enospc",
        "took-lease",
        "cut-made",
        "cut-back",
        "stop-in-append",
    ):
        raise SystemExit(f"unknown kill point {kill_at}")


def _fill_the_disk_in_appends(committed: dict, target: int) -> None:
    """Every derived-log append after commit ``target`` fails with ENOSPC where its bytes
    are written (inside the storage call, as a full disk fails it)."""
    import popflow.infra.storage.local_files as local_files
    import popflow.infra.storage.log_writes as log_writes

    original_write = local_files.write_all
    original_append = log_writes.LogWrites.append
    state = {"in_append": False}

    def append(self, path, data):
        state["in_append"] = True
        try:
            return original_append(self, path, data)
        finally:
            state["in_append"] = False

    def write_all(fd, data):
        log = committed.get("log")
        if state["in_append"] and log is not None and log.seq >= target:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original_write(fd, data)

    log_writes.LogWrites.append = append
    local_files.write_all = write_all


def _stop_inside_appends(committed: dict, target: int) -> None:
    """SIGSTOP this process once, just before the bytes of a ``result.json`` append after
    commit ``target`` are written (after every check the append makes)."""
    import popflow.infra.storage.local_files as local_files
    import popflow.infra.storage.log_writes as log_writes

    original_write = local_files.write_all
    original_append = log_writes.LogWrites.append
    state = {"in_append": None, "stopped": False}

    def append(self, path, data):
        state["in_append"] = path
        try:
            return original_append(self, path, data)
        finally:
            state["in_append"] = None

    def write_all(fd, data):
        log = committed.get("log")
        path = state["in_append"]
        if (
            not state["stopped"] and path is not None and path.endswith("/result.json")
            and log is not None and log.seq >= target
        ):  # fmt: skip
            state["stopped"] = True
            os.kill(os.getpid(), signal.SIGSTOP)
        return original_write(fd, data)

    log_writes.LogWrites.append = append
    local_files.write_all = write_all


def _wait_until_recorded(name: str, timeout: float = 120.0) -> None:
    """Poll the API until a Running ``tune`` run of experiment ``name`` has a Running task."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with get_client(sync_client=True) as client:
            runs = [
                r for r in client.read_flow_runs(sort=FlowRunSort.EXPECTED_START_TIME_DESC)
                if (r.parameters or {}).get("name") == name and r.state.is_running()
            ]  # fmt: skip
            tasks = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[runs[0].id]))
            ) if runs else []  # fmt: skip
            # state_type: the task run's own column (its state row may be a moment behind)
            if any(t.state_type == StateType.RUNNING for t in tasks):
                return
        time.sleep(0.1)  # polling the API, not synchronising on time
    raise SystemExit(f"Prefect's record of {name} did not catch up in {timeout} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("storage")
    parser.add_argument("name")
    parser.add_argument("scheduler")
    parser.add_argument("--kill-at")
    parser.add_argument("--lease-ttl", type=float, default=60.0)
    parser.add_argument("--pad-bytes", type=int, default=0, help="checkpoint size")
    parser.add_argument("--num-to-keep", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=ITERATIONS, help="each trial's")
    parser.add_argument(
        "--num-samples", type=int, default=4, help="trials (a: 10, 20, 40, 30, ...)"
    )
    parser.add_argument(
        "--search",
        choices=["optuna", "bohb", "ax", "hebo"],
        help="trials suggested by a search algorithm (a: an integer in [10, 40])",
    )
    args = parser.parse_args()
    inject(args.kill_at)
    values = itertools.cycle([10, 20, 40, 30])
    a = sample_from(lambda _: next(values)) if args.search is None else randint(10, 41)
    run(
        ParityTrainable,
        {"a": a, "c": 1, "pad": args.pad_bytes},
        search_alg=search_alg(args.search),
        scheduler=scheduler(args.scheduler, args.iterations),
        metric="mean_accuracy",
        mode="max",
        num_samples=1 if args.scheduler == "replay" else args.num_samples,
        stop={"training_iteration": args.iterations},
        checkpoint_config=CheckpointConfig(
            checkpoint_frequency=1,
            num_to_keep=args.num_to_keep,
            checkpoint_score_attribute="mean_accuracy",
        ),
        storage=args.storage,
        storage_options=json.loads(os.environ.get("POPFLOW_TEST_STORAGE_OPTIONS", "null")),
        name=args.name,
        seed=0,
        n_workers=2,
        # asynchronous schedulers: a commit per batch of results, so that a kill point
        # "commit N" is reached by construction, however fast the machine
        commit_interval=1e-6,
        lease_ttl=args.lease_ttl,
        resume="auto",
    )


if __name__ == "__main__":
    main()
