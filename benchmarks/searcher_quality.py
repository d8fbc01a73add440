"""Search quality at equal budget: random search, OptunaSearch, ASHA + OptunaSearch and
BOHB on popflow, and Optuna's own ``optimize`` with the same sampler (and pruner), side by side.

The objective is a real model: ``examples/digits_mlp.py``'s MLP on scikit-learn's
bundled digits, tuned over its ``lr``, ``momentum`` and ``weight_decay``; an iteration
is ``EPOCHS`` epochs of SGD and the score is the validation log loss (lower is better)
after ``max_t`` iterations. The budget is iterations: random search and OptunaSearch
train ``--trials`` trials to ``max_t``; the early-stopping methods get ``--asha-trials``
trials and stop most early, and the table shows the iterations each spent.

- ``random``: popflow, ``FIFOScheduler``, its own random sampling;
- ``optuna``: popflow, ``ConcurrencyLimiter(OptunaSearch(), 2)`` (TPE, seeded by the run);
- ``asha+optuna``: the same searcher with ``ASHAScheduler(grace_period=1,
  reduction_factor=3)``;
- ``bohb``: popflow, ``ConcurrencyLimiter(TuneBOHB(), 2)`` with
  ``HyperBandForBOHB(reduction_factor=3)``, the ``--asha-trials`` trials;
- ``optuna.optimize``: ``TPESampler(seed)``, no pruner, ``n_jobs=2`` threads;
- ``optuna.optimize+SHA``: the same with ``SuccessiveHalvingPruner(min_resource=1,
  reduction_factor=3)`` (ASHA's rungs), the ``--asha-trials`` trials.

Each run is a fresh process, timed from outside (popflow on its embedded default: no
``PREFECT_API_URL``, popflow's local Prefect server, started by an uncounted first run);
the quality is the best validation loss of a trial trained to ``max_t``. ``--seeds``
seeds per method; the table gives the median and range over them.

    .venv/bin/python benchmarks/searcher_quality.py                 # 5 seeds, ~15 min
    .venv/bin/python benchmarks/searcher_quality.py --quick         # 2 seeds, small
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()

import argparse  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from common import (  # noqa: E402
    RESULTS_DIR,
    emit,
    load_example,
    python,
    run_json,
    scratch_dir,
    table,
    write_json,
)

WORKERS = 2
#: epochs of SGD per iteration (an epoch of the digits MLP is ~10 ms: too short to say
#: anything about a tuner's overhead)
EPOCHS = 5
METHODS = ["random", "optuna", "asha+optuna", "bohb", "optuna.optimize", "optuna.optimize+SHA"]
POPFLOW_METHODS = {"random", "optuna", "asha+optuna", "bohb"}
#: the methods that stop trials early, given ``--asha-trials`` trials
EARLY_STOPPING = {"asha+optuna", "bohb", "optuna.optimize+SHA"}


def make_trainable() -> type:
    """The digits MLP with ``EPOCHS`` epochs per iteration."""
    example = load_example("digits_mlp")

    class DigitsEpochs(example.DigitsMLP):
        def step(self) -> dict[str, Any]:
            for _ in range(EPOCHS - 1):
                super().step()
            return super().step()

    return DigitsEpochs


def run_popflow(args: argparse.Namespace) -> None:
    from popflow import ASHAScheduler, FIFOScheduler, run
    from popflow.tune.schedulers.hb_bohb import HyperBandForBOHB
    from popflow.tune.search import ConcurrencyLimiter
    from popflow.tune.search.bohb import TuneBOHB
    from popflow.tune.search.optuna import OptunaSearch

    example = load_example("digits_mlp")
    asha = args.method in EARLY_STOPPING
    searcher = {
        "random": None,
        "optuna": lambda: ConcurrencyLimiter(OptunaSearch(), WORKERS),
        "asha+optuna": lambda: ConcurrencyLimiter(OptunaSearch(), WORKERS),
        "bohb": lambda: ConcurrencyLimiter(TuneBOHB(), WORKERS),
    }[args.method]
    scheduler = {
        "asha+optuna": lambda: ASHAScheduler(max_t=args.max_t, grace_period=1, reduction_factor=3),
        "bohb": lambda: HyperBandForBOHB(max_t=args.max_t, reduction_factor=3),
    }.get(args.method, FIFOScheduler)()
    with scratch_dir("popflow-bench-searchers-") as storage:
        start = time.perf_counter()
        results = run(
            make_trainable(),
            example.param_space(),
            scheduler=scheduler,
            search_alg=searcher() if searcher else None,
            metric="val_loss",
            mode="min",
            num_samples=args.asha_trials if asha else args.trials,
            stop={"training_iteration": args.max_t},
            storage=storage,
            name="searchers",
            seed=args.seed,
            n_workers=WORKERS,
            verbose=0,
        )
        wall = time.perf_counter() - start
    last = [r.metrics for r in results]
    full = [m["val_loss"] for m in last if m.get("training_iteration") == args.max_t]
    emit(
        {
            "tune_wall_s": wall,
            "trials": len(last),
            "iterations": sum(int(m.get("training_iteration", 0)) for m in last),
            "best_val_loss": min(full),
            "errors": results.num_errors,
            "script_wall_s": time.perf_counter() - _T0,
        }
    )


def run_optuna(args: argparse.Namespace) -> None:
    import optuna

    example = load_example("digits_mlp")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trainable = make_trainable()
    pruned = args.method == "optuna.optimize+SHA"
    spent: list[int] = []

    def objective(trial: Any) -> float:
        config = {
            "lr": trial.suggest_float("lr", *example.LR, log=True),
            "momentum": trial.suggest_float("momentum", *example.MOMENTUM),
            "weight_decay": trial.suggest_float("weight_decay", *example.WEIGHT_DECAY, log=True),
        }
        model = trainable(config)
        loss = float("inf")
        for it in range(1, args.max_t + 1):
            loss = model.step()["val_loss"]
            trial.report(loss, it)
            if pruned and it < args.max_t and trial.should_prune():
                spent.append(it)
                raise optuna.TrialPruned()
        spent.append(args.max_t)
        return loss

    start = time.perf_counter()
    study = optuna.create_study(
        direction="minimize",
        sampler=optuna.samplers.TPESampler(seed=args.seed),
        pruner=optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3)
        if pruned
        else optuna.pruners.NopPruner(),
    )
    study.optimize(objective, n_trials=args.asha_trials if pruned else args.trials, n_jobs=WORKERS)
    wall = time.perf_counter() - start
    emit(
        {
            "tune_wall_s": wall,
            "trials": len(study.trials),
            "iterations": sum(spent),
            "best_val_loss": float(study.best_value),
            "errors": 0,
            "optuna": optuna.__version__,
            "script_wall_s": time.perf_counter() - _T0,
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="2 seeds, fewer trials")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--trials", type=int, default=30, help="trials trained to max_t")
    parser.add_argument(
        "--asha-trials", type=int, default=90, help="trials of the early-stopping methods"
    )
    parser.add_argument("--max-t", type=int, default=12, help="iterations of a full trial")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--method", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.method:
        (run_popflow if args.method in POPFLOW_METHODS else run_optuna)(args)
        return
    if args.quick:
        args.seeds, args.trials, args.asha_trials, args.max_t = 2, 8, 24, 6
    methods = args.methods.split(",")
    me = [python(), str(Path(__file__).resolve())]
    workload = [
        "--trials", str(args.trials), "--asha-trials", str(args.asha_trials),
        "--max-t", str(args.max_t),
    ]  # fmt: skip
    logs = RESULTS_DIR / "logs"
    home = RESULTS_DIR / "prefect-home-searchers"
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update({"PREFECT_HOME": str(home), "OMP_NUM_THREADS": "1"})
    print(
        f"digits MLP, {EPOCHS} epochs an iteration, {args.max_t} iterations a full trial; "
        f"{args.trials} trials (random, optuna) or {args.asha_trials} (ASHA, SHA, BOHB); "
        f"{args.seeds} seeds; {WORKERS} workers",
        flush=True,
    )
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    try:
        if POPFLOW_METHODS & set(methods):  # the local Prefect server, started uncounted
            run_json(
                [*me, "--method", "random", "--trials", "1", "--max-t", "1"],
                env=env,
                log_path=logs / "searchers_first.log",
            )
        for seed in range(args.seeds):  # methods alternate within a seed: same load
            for method in methods:
                out = run_json(
                    [*me, "--method", method, "--seed", str(seed), *workload],
                    env=env,
                    log_path=logs / f"searchers_{method}_{seed}.log",
                )
                runs[method].append(out)
                print(
                    f"{method} seed {seed}: best {out['best_val_loss']:.4f}, "
                    f"{out['iterations']} iterations, process {out['process_wall_s']:.1f} s",
                    flush=True,
                )
    finally:
        subprocess.run(
            [python(), "-m", "popflow.flows.api.cli", "server", "stop"],
            env={**os.environ, "PREFECT_HOME": str(home)},
            check=False,
        )
    rows = []
    summary: dict[str, Any] = {}
    for method, outs in runs.items():
        best = [o["best_val_loss"] for o in outs]
        walls = [o["process_wall_s"] for o in outs]
        its = [o["iterations"] for o in outs]
        summary[method] = {
            "best_median": statistics.median(best),
            "best_range": [min(best), max(best)],
            "iterations_median": statistics.median(its),
            "process_wall_median_s": statistics.median(walls),
        }
        rows.append(
            [
                method,
                statistics.median(best),
                f"{min(best):.4f}-{max(best):.4f}",
                int(statistics.median(its)),
                statistics.median(walls),
                f"{min(walls):.1f}-{max(walls):.1f}",
            ]
        )
    print(
        table(
            ["method", "best val_loss (median)", "range", "iterations", "process s", "range"],
            rows,
        )
    )
    path = write_json(
        "searcher_quality",
        {
            "workload": {**vars(args), "epochs_per_iteration": EPOCHS, "workers": WORKERS},
            "summary": summary,
            "runs": runs,
        },
    )
    print(f"figures written to {path}")


if __name__ == "__main__":
    main()
