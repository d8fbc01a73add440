"""ASHA worker efficiency against Optuna and Ray Tune (issues 3 and 14).

The ``examples/async_hyperband.py`` workload: 20 trials of up to 100
iterations of 0.1 s, ``ASHAScheduler(grace_period=5, max_t=100)``, 2 workers.
Efficiency = (total iterations x 0.1 s / 2 workers) / wall, where total
iterations is the sum of each trial's final training_iteration: the share of
the wall time the two slots spent training.

Whole process (issue 14's target, >= 0.95): each system as a fresh
``python script.py``, start-up inside the timer. popflow on its embedded
default (no ``PREFECT_API_URL``, popflow's local Prefect server started by a
first, uncounted run, as for a user who has run popflow before); Optuna with
``SuccessiveHalvingPruner(min_resource=5, reduction_factor=4)`` (ASHA's rungs),
a random sampler and ``n_jobs=2`` threads, no storage server; Ray Tune with
``ray.init(num_cpus=2)`` (``benchmarks/ray_side.py asha``).

Also the library calls alone (issue 3's target, >= 0.85): popflow's ``run()``
on a pre-started 2-worker cluster (as Ray's ``fit()`` runs after
``ray.init``) and on the embedded cluster it starts itself, reporting to a
Prefect server started first; Optuna's ``optimize()``; Ray's ``fit()``.

    .venv/bin/python benchmarks/asha_efficiency.py
    .venv/bin/python benchmarks/asha_efficiency.py --quick    # 6 trials of up to 20 iterations
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from common import (  # noqa: E402
    BENCHMARKS,
    RESULTS_DIR,
    PrefectServer,
    emit,
    load_example,
    python,
    run_json,
    scratch_dir,
    table,
    verdict,
    write_json,
)

STEP_S = 0.1
WORKERS = 2
EFFICIENCY_TARGET = 0.85
#: a fresh process on the embedded default, start-up inside the timer (issue 14)
WHOLE_PROCESS_TARGET = 0.95


def efficiency(iterations: int, wall: float) -> float:
    return (iterations * STEP_S / WORKERS) / wall


def runner(args: argparse.Namespace) -> None:
    from popflow import run
    from popflow.infra.cluster.dask_cluster import dask_client

    example = load_example("async_hyperband")
    figures: dict[str, Any] = {"cluster": "prestarted" if args.prestart else "embedded"}
    with contextlib.ExitStack() as stack:
        storage = stack.enter_context(scratch_dir("popflow-bench-asha-"))
        cluster: dict[str, Any] = {"n_workers": WORKERS}
        if args.prestart:
            start = time.perf_counter()
            cluster = {"dask_address": stack.enter_context(dask_client(None, WORKERS))}
            figures["cluster_start_s"] = time.perf_counter() - start
        start = time.perf_counter()
        results = run(
            example.easy_objective,
            param_space=example.param_space(args.steps),
            scheduler=example.make_scheduler(max_t=args.max_t, grace_period=5),
            metric="mean_loss",
            mode="min",
            num_samples=args.num_samples,
            storage=storage,
            name="asha",
            seed=args.seed,
            **cluster,
        )
        wall = time.perf_counter() - start
    last = sorted(int(r.metrics.get("training_iteration", 0)) for r in results)
    figures.update(
        {
            "tune_wall_s": wall,
            "per_trial_iterations": last,
            "total_iterations": sum(last),
            "best_mean_loss": float(results.get_best_result().metrics["mean_loss"]),
            "errored_trials": results.num_errors,
            "script_wall_s": time.perf_counter() - _T0,
        }
    )
    emit(figures)


def runner_optuna(args: argparse.Namespace) -> None:
    """The same workload on Optuna: ``SuccessiveHalvingPruner`` (min resource 5, reduction
    factor 4: ASHA's rungs 5, 20, 80), a random sampler, ``n_jobs=2`` threads, no storage
    server; a trial's loss is reported each 0.1 s iteration and pruned when told."""
    import optuna

    example = load_example("async_hyperband")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    iterations: list[int] = []

    def objective(trial: Any) -> float:
        width = trial.suggest_float("width", 10, 100)
        height = trial.suggest_float("height", 0, 100)
        loss = math.inf
        for step in range(args.steps):
            time.sleep(STEP_S)
            loss = example.evaluation_fn(step, width, height)
            trial.report(loss, step + 1)
            if step + 1 >= args.max_t:
                break
            if trial.should_prune():
                iterations.append(step + 1)
                raise optuna.TrialPruned()
        iterations.append(min(args.steps, args.max_t))
        return loss

    start = time.perf_counter()
    study = optuna.create_study(
        direction="minimize",
        sampler=optuna.samplers.RandomSampler(seed=args.seed),
        pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=5, reduction_factor=4),
    )
    study.optimize(objective, n_trials=args.num_samples, n_jobs=WORKERS)
    wall = time.perf_counter() - start
    emit(
        {
            "tune_wall_s": wall,
            "per_trial_iterations": sorted(iterations),
            "total_iterations": sum(iterations),
            "best_mean_loss": float(study.best_value),
            "optuna": optuna.__version__,
            "script_wall_s": time.perf_counter() - _T0,
        }
    )


def _describe(last: list[int]) -> str:
    counts: dict[int, int] = {}
    for it in last:
        counts[it] = counts.get(it, 0) + 1
    return ", ".join(f"{n}x{it}" for it, n in sorted(counts.items()))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="short sanity run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--runner-optuna", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--prestart", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--num-samples", type=int, default=20, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=100, help=argparse.SUPPRESS)
    parser.add_argument("--max-t", type=int, default=100, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.runner:
        runner(args)
        return
    if args.runner_optuna:
        runner_optuna(args)
        return

    if args.quick:
        args.num_samples, args.steps, args.max_t = 6, 20, 20
    workload = [
        "--seed", str(args.seed), "--num-samples", str(args.num_samples),
        "--steps", str(args.steps), "--max-t", str(args.max_t),
    ]  # fmt: skip
    me = [python(), str(Path(__file__).resolve()), "--runner", *workload]
    logs = RESULTS_DIR / "logs"
    print(
        f"ASHA: {args.num_samples} trials, up to {args.max_t} iterations of {STEP_S} s, "
        f"grace 5, {WORKERS} workers",
        flush=True,
    )
    # the embedded default as a user runs it: no PREFECT_API_URL, popflow's local Prefect
    # server (started by a first run, not counted), a fresh process; efficiency by its
    # whole-process wall
    home = RESULTS_DIR / "prefect-home-asha"
    home.mkdir(parents=True, exist_ok=True)
    embedded_env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    embedded_env["PREFECT_HOME"] = str(home)
    first = run_json(
        [python(), str(Path(__file__).resolve()), "--runner", "--num-samples", "2",
         "--steps", "5", "--max-t", "5"],
        env=embedded_env, log_path=logs / "asha_popflow_first.log",
    )  # fmt: skip
    try:
        embedded = run_json(me, env=embedded_env, log_path=logs / "asha_popflow_default.log")
    finally:
        subprocess.run(
            [python(), "-m", "popflow.flows.api.cli", "server", "stop"],
            env={**os.environ, "PREFECT_HOME": str(home)},
            check=False,
        )
    optuna_run = run_json(
        [python(), str(Path(__file__).resolve()), "--runner-optuna", *workload],
        log_path=logs / "asha_optuna.log",
    )
    with PrefectServer() as server:
        print(f"prefect server on {server.url}, started in {server.startup_s:.2f} s", flush=True)
        warm = run_json(
            [*me, "--prestart"],
            env=server.client_env(),
            log_path=logs / "asha_popflow_prestarted.log",
        )
        cold = run_json(me, env=server.client_env(), log_path=logs / "asha_popflow_embedded.log")
    ray = run_json(
        [python(), str(BENCHMARKS / "ray_side.py"), "asha", *workload],
        log_path=logs / "asha_ray.log",
    )

    rows = []
    for label, run, wall in (
        ("popflow (embedded default, whole process)", embedded, embedded["process_wall_s"]),
        ("optuna (whole process)", optuna_run, optuna_run["process_wall_s"]),
        ("ray (whole process)", ray, ray["process_wall_s"]),
        ("popflow (pre-started cluster, run())", warm, warm["tune_wall_s"]),
        ("popflow (embedded cluster, run())", cold, cold["tune_wall_s"]),
        ("optuna (optimize())", optuna_run, optuna_run["tune_wall_s"]),
        ("ray (fit())", ray, ray["fit_wall_s"]),
    ):
        run.setdefault("efficiencies", {})[label] = efficiency(run["total_iterations"], wall)
        run["efficiency"] = efficiency(run["total_iterations"], wall)
        rows.append(
            [
                label,
                wall,
                run["process_wall_s"],
                run["total_iterations"],
                run["efficiency"],
                _describe(run["per_trial_iterations"]),
            ]
        )
    print(
        table(
            ["system", "tune/fit wall s", "process s", "iterations", "efficiency", "per trial"],
            rows,
        )
    )
    figures = {
        "quick": args.quick,
        "workload": {
            "num_samples": args.num_samples,
            "steps": args.steps,
            "max_t": args.max_t,
            "grace_period": 5,
            "step_s": STEP_S,
            "workers": WORKERS,
            "seed": args.seed,
        },
        "prefect_server_startup_s": server.startup_s,
        "popflow_first_embedded_run": first,
        "popflow_embedded_default": embedded,
        "optuna": optuna_run,
        "efficiency_whole_process": {
            "popflow": efficiency(embedded["total_iterations"], embedded["process_wall_s"]),
            "optuna": efficiency(optuna_run["total_iterations"], optuna_run["process_wall_s"]),
            "ray": efficiency(ray["total_iterations"], ray["process_wall_s"]),
        },
        "whole_process_target": WHOLE_PROCESS_TARGET,
        "popflow_prestarted": warm,
        "popflow_embedded": cold,
        "ray": ray,
        "efficiency_ratio_popflow_ray": warm["efficiency"] / ray["efficiency"],
        "wall_ratio_popflow_ray": warm["tune_wall_s"] / ray["fit_wall_s"],
        "target": EFFICIENCY_TARGET,
        "target_met": warm["efficiency"] >= EFFICIENCY_TARGET,
        "target_met_embedded": cold["efficiency"] >= EFFICIENCY_TARGET,
    }
    print(
        f"popflow efficiency {warm['efficiency']:.3f} on a pre-started cluster (its start-up "
        f"{warm['cluster_start_s']:.2f} s), {cold['efficiency']:.3f} with the embedded one; "
        f"target >= {EFFICIENCY_TARGET}: {verdict(figures['target_met'])} / "
        f"{verdict(figures['target_met_embedded'])}. Ray {ray['efficiency']:.3f}. "
        f"Ratio popflow/Ray: efficiency {figures['efficiency_ratio_popflow_ray']:.2f}x, "
        f"wall {figures['wall_ratio_popflow_ray']:.3f}"
    )
    whole = figures["efficiency_whole_process"]
    print(
        f"whole process (a fresh `python script.py`, embedded default): popflow "
        f"{whole['popflow']:.3f}, Optuna {whole['optuna']:.3f}, Ray {whole['ray']:.3f}; "
        f"target >= {WHOLE_PROCESS_TARGET}: {verdict(whole['popflow'] >= WHOLE_PROCESS_TARGET)}"
    )
    path = write_json("asha_efficiency", figures)
    print(f"figures written to {path}")


if __name__ == "__main__":
    sys.exit(main())
