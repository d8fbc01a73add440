"""Driver bookkeeping at scale (issue 3): 1,000 one-iteration trials on 8 worker slots.

Each trial is a function that sleeps 0.5 s and reports once; ``FIFOScheduler``;
a LocalCluster of 8 single-thread process workers (started before ``run()``;
its start-up is reported separately). The theoretical minimum is
1000 x 0.5 s / 8 = 62.5 s; overhead % = (wall - minimum) / minimum (target <= 10 %).
Also the driver's peak memory: ``ru_maxrss`` of the driver process (it hosts
the Dask scheduler of the LocalCluster too), before and after ``run()``, and
with ``--tracemalloc`` a second run under ``tracemalloc`` for the peak of
Python allocations during ``run()`` (that run's wall is not the figure: tracing slows it).

    .venv/bin/python benchmarks/bookkeeping.py                   # 1,000 trials
    .venv/bin/python benchmarks/bookkeeping.py --tracemalloc     # plus the traced run
    .venv/bin/python benchmarks/bookkeeping.py --quick           # 100 trials
    .venv/bin/python benchmarks/bookkeeping.py --trials 10000 --sleep 0.05   # issue 14's scale

Issue 14's scale targets, from the same run: overhead <= 10 %; driver peak RSS <= 300 MiB
and flat in the number of rounds (its peak in a second run of the same work with ten
times the rounds, ``commit_interval`` / 10, within 10 % of the first's; the resident
memory after each commit is in the figures too); per-commit bytes and seconds proportional to what the round changed (the
deltas' bytes and ms per result they carry, their spread; the snapshots, which hold
the whole state, apart).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from common import (
    RESULTS_DIR,
    CommitRecorder,
    PrefectServer,
    emit,
    python,
    run_json,
    scratch_dir,
    table,
    verdict,
    write_json,
)

from popflow.schedulers import FIFOScheduler, uniform
from popflow.tasks import report

SLEEP_S = 0.5
SLOTS = 8
OVERHEAD_TARGET = 0.10
RSS_TARGET_MIB = 300.0


def sleep_once(config: dict[str, Any]) -> None:
    """One iteration of ``config["sleep"]`` s (0.5 by default), one report."""
    time.sleep(config["sleep"])
    report({"score": config["x"]})


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def runner(args: argparse.Namespace) -> None:
    from popflow.infra.cluster.dask_cluster import dask_client

    figures: dict[str, Any] = {"trials": args.trials, "tracemalloc": args.tracemalloc}
    with scratch_dir("popflow-bench-bookkeeping-") as storage:
        start = time.perf_counter()
        with dask_client(None, SLOTS) as client:
            figures["cluster_start_s"] = time.perf_counter() - start
            figures["maxrss_before_tune_mib"] = _maxrss_mib()
            if args.tracemalloc:
                tracemalloc.start()
            start = time.perf_counter()
            with CommitRecorder() as commits:
                results = _run(args, storage, client)
            figures["tune_wall_s"] = time.perf_counter() - start
            figures["results"] = sum(len(r.history) for r in results)  # read from storage
            if args.tracemalloc:
                current, peak = tracemalloc.get_traced_memory()
                tracemalloc.stop()
                figures["tracemalloc_peak_mib"] = peak / 2**20
                figures["tracemalloc_after_mib"] = current / 2**20
            figures["maxrss_after_tune_mib"] = _maxrss_mib()
    figures["terminated"] = results.num_terminated
    figures["errored_trials"] = results.num_errors
    figures["commit_interval_s"] = args.commit_interval
    figures["commits"] = _commit_figures(commits)
    emit(figures)


def _commit_figures(commits: CommitRecorder) -> dict[str, Any]:
    """The commits' bytes and seconds (deltas per result carried; snapshots apart), and the
    driver's resident memory after each, as it goes."""
    deltas = [
        (size, seconds, n)
        for size, seconds, n, snap in zip(
            commits.sizes, commits.seconds, commits.results, commits.snapshots, strict=True
        )
        if not snap and n
    ]
    per_result = sorted(size / n for size, _, n in deltas)
    ms_per_result = sorted(1000 * seconds / n for _, seconds, n in deltas)
    rss = commits.rss_mib
    quarter = len(rss) // 4
    return {
        "count": len(commits.sizes),
        "bytes_written": sum(commits.sizes),
        "snapshots": sum(commits.snapshots),
        "snapshot_bytes_max": max(
            (s for s, snap in zip(commits.sizes, commits.snapshots, strict=True) if snap),
            default=0,
        ),
        "snapshot_seconds_max": max(
            (t for t, snap in zip(commits.seconds, commits.snapshots, strict=True) if snap),
            default=0.0,
        ),
        "delta_bytes_per_result_median": per_result[len(per_result) // 2] if deltas else None,
        "delta_bytes_per_result_p90": per_result[int(0.9 * (len(per_result) - 1))]
        if deltas
        else None,
        "delta_ms_per_result_median": ms_per_result[len(ms_per_result) // 2] if deltas else None,
        "delta_seconds_max": max((t for _, t, _ in deltas), default=0.0),
        "rss_mib": rss,
        "rss_quarter_mib": rss[quarter] if rss else None,
        "rss_end_mib": rss[-1] if rss else None,
        # growth of the driver's memory per 100 rounds, from a quarter of the run to its end
        "rss_growth_mib_per_100_rounds": (
            100 * (rss[-1] - rss[quarter]) / (len(rss) - 1 - quarter)
            if len(rss) - 1 > quarter
            else None
        ),
    }


def _run(args: argparse.Namespace, storage: str, client: Any) -> Any:
    from popflow import run

    return run(
        sleep_once,
        param_space={"x": uniform(0, 1), "sleep": args.sleep},
        scheduler=FIFOScheduler(),
        metric="score",
        mode="max",
        num_samples=args.trials,
        storage=storage,
        name="bookkeeping",
        seed=0,
        dask_address=client,
        commit_interval=args.commit_interval,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="100 trials")
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--sleep", type=float, default=SLEEP_S, help="seconds per trial")
    parser.add_argument("--tracemalloc", action="store_true", help="also a traced run")
    parser.add_argument(
        "--commit-interval", type=float, default=1.0, help="the first run's (run()'s default)"
    )
    parser.add_argument(
        "--no-rounds-check",
        action="store_true",
        help="skip the second run, with ten times the rounds (memory flat in the rounds)",
    )
    parser.add_argument("--runner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.runner:
        runner(args)
        return

    trials = 100 if args.quick else args.trials
    minimum = trials * args.sleep / SLOTS
    me = [python(), str(Path(__file__).resolve()), "--runner", "--trials", str(trials),
          "--sleep", str(args.sleep), "--commit-interval", str(args.commit_interval)]  # fmt: skip
    logs = RESULTS_DIR / "logs"
    print(
        f"{trials} trials x one {args.sleep} s iteration on {SLOTS} slots, FIFO; "
        f"theoretical minimum {minimum:.1f} s",
        flush=True,
    )
    with PrefectServer() as server:
        print(f"prefect server on {server.url}, started in {server.startup_s:.2f} s", flush=True)
        run = run_json(me, env=server.client_env(), log_path=logs / "bookkeeping.log")
        traced = (
            run_json(
                [*me, "--tracemalloc"],
                env=server.client_env(),
                log_path=logs / "bookkeeping_tracemalloc.log",
            )
            if args.tracemalloc
            else None
        )
        # the same work in ten times the rounds: the driver's memory must not follow them
        more_rounds = (
            None
            if args.no_rounds_check
            else run_json(
                [*me[:-1], str(args.commit_interval / 10)],
                env=server.client_env(),
                log_path=logs / "bookkeeping_rounds.log",
            )
        )
    overhead = (run["tune_wall_s"] - minimum) / minimum
    with_cluster = (run["tune_wall_s"] + run["cluster_start_s"] - minimum) / minimum
    rows = [
        [
            "popflow",
            trials,
            run["tune_wall_s"],
            minimum,
            f"{100 * overhead:.1f} %",
            f"{100 * with_cluster:.1f} %",
            run["maxrss_before_tune_mib"],
            run["maxrss_after_tune_mib"],
            traced["tracemalloc_peak_mib"] if traced else "-",
        ]
    ]
    print(
        table(
            [
                "system",
                "trials",
                "tune wall s",
                "minimum s",
                "overhead",
                "incl. cluster start",
                "maxrss before MiB",
                "maxrss after MiB",
                "tracemalloc peak MiB",
            ],
            rows,
        )
    )
    print(
        f"overhead {100 * overhead:.1f} % (target <= {100 * OVERHEAD_TARGET:.0f} %: "
        f"{verdict(overhead <= OVERHEAD_TARGET)}); cluster start-up {run['cluster_start_s']:.2f} s; "
        f"{run['terminated']} trials terminated, {run['errored_trials']} errors, "
        f"{run['results']} results"
        + (f"; traced run's wall {traced['tune_wall_s']:.1f} s" if traced else "")
    )
    commits = run["commits"]
    print(
        f"commits: {commits['count']} ({commits['snapshots']} snapshots, the largest "
        f"{commits['snapshot_bytes_max'] / 2**20:.1f} MiB in {commits['snapshot_seconds_max']:.3f} "
        f"s); deltas {commits['delta_bytes_per_result_median']:.0f} B and "
        f"{commits['delta_ms_per_result_median']:.3f} ms per result (median; p90 "
        f"{commits['delta_bytes_per_result_p90']:.0f} B), the slowest "
        f"{commits['delta_seconds_max']:.3f} s; {commits['bytes_written'] / 2**20:.1f} MiB "
        "written in all"
    )
    rss_ok = run["maxrss_after_tune_mib"] <= RSS_TARGET_MIB
    flat = None
    if more_rounds is not None:
        growth = more_rounds["maxrss_after_tune_mib"] - run["maxrss_after_tune_mib"]
        flat = growth <= 0.1 * run["maxrss_after_tune_mib"]
        print(
            f"driver peak RSS {run['maxrss_after_tune_mib']:.1f} MiB in {commits['count']} rounds, "
            f"{more_rounds['maxrss_after_tune_mib']:.1f} MiB in "
            f"{more_rounds['commits']['count']} rounds (commit_interval "
            f"{args.commit_interval / 10:g} s; its wall {more_rounds['tune_wall_s']:.1f} s): "
            f"{growth:+.1f} MiB (target <= {RSS_TARGET_MIB:.0f} MiB: {verdict(rss_ok)}; flat in "
            f"the rounds, within 10 %: {verdict(flat)})"
        )
    figures = {
        "more_rounds_run": more_rounds,
        "rss_target_met": rss_ok,
        "rss_flat_in_rounds": flat,
        "quick": args.quick,
        "trials": trials,
        "slots": SLOTS,
        "sleep_s": args.sleep,
        "theoretical_minimum_s": minimum,
        "prefect_server_startup_s": server.startup_s,
        "run": run,
        "tracemalloc_run": traced,
        "overhead": overhead,
        "overhead_incl_cluster_start": with_cluster,
        "target": OVERHEAD_TARGET,
        "target_met": overhead <= OVERHEAD_TARGET,
    }
    path = write_json("bookkeeping", figures)
    print(f"figures written to {path}")


if __name__ == "__main__":
    sys.exit(main())
