"""PBT and PB2 against ASHA and random search on a real model, at equal compute.

The model is ``examples/digits_mlp.py``: an MLP trained with SGD on
scikit-learn's digits; PBT and PB2 mutate its learning rate, momentum and
weight decay. Every method gets the same budget of trained epochs,
``population x epochs``: random search (FIFO) and PBT/PB2 train ``population``
trials for ``epochs`` each; ASHA (grace 2, reduction 4: Ray's default, ``max_t=epochs``)
samples as many trials as that budget buys if a quarter go on at each rung
(:func:`asha_samples`) and stops most early (the epochs it used are reported). Each (method, population) runs over ``--seeds``
seeds; the table gives the best trial's final validation accuracy and log
loss, median (min-max) over the seeds. The hyperparameter schedules PBT and
PB2 found (first seed, each population size) are drawn to
``bench-results/pbt_vs_baselines_<time>_<method>_<population>.png``
(matplotlib, the ``plots`` extra).

    .venv/bin/python benchmarks/pbt_vs_baselines.py                 # 5 seeds, 4 and 16: ~15 min
    .venv/bin/python benchmarks/pbt_vs_baselines.py --seeds 2 --populations 4 --epochs 12

Targets: PBT's median >= random search's; PB2's median >= PBT's at population 4.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
from typing import Any

from common import RESULTS_DIR, load_example, scratch_dir, table, verdict, write_json

METHODS = ("random", "asha", "pbt", "pb2")


def asha_samples(population: int, epochs: int, grace: int = 2, eta: int = 4) -> int:
    """How many trials ASHA samples to spend ``population x epochs`` epochs, if a quarter
    of the trials reaching each rung go on (asynchronous ASHA promotes a few more)."""
    rungs = []
    milestone = grace
    while milestone < epochs:
        rungs.append(milestone)
        milestone *= eta
    rungs.append(epochs)
    expected, previous = 0.0, 0
    for k, milestone in enumerate(rungs):
        expected += eta**-k * (milestone - previous)
        previous = milestone
    return max(population, round(population * epochs / expected))


def best_of(results: Any) -> tuple[float, float, int]:
    """The best trial's final validation accuracy, its log loss, and the epochs trained."""
    best = results.get_best_result("mean_accuracy", "max")
    epochs = sum(int(r.metrics.get("training_iteration", 0)) for r in results)
    return best.metrics["mean_accuracy"], best.metrics["val_loss"], epochs


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.4f} ({min(values):.4f}-{max(values):.4f})"


def plot_schedule(results: Any, title: str, path: str) -> None:
    """Each mutated hyperparameter against epochs, one line per trial (exploits are the
    jumps), and the validation accuracy below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ("lr", "momentum", "weight_decay", "mean_accuracy")
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 10), sharex=True)
    for r in results:
        steps = [h["training_iteration"] for h in r.history]
        for ax, name in zip(axes, names, strict=True):
            values = [h[name] if name == "mean_accuracy" else h["config"][name] for h in r.history]
            ax.plot(steps, values, drawstyle="steps-post", label=r.trial_id)
    for ax, name in zip(axes, names, strict=True):
        ax.set_ylabel(name)
        if name in ("lr", "weight_decay"):
            ax.set_yscale("log")
    axes[0].set_title(title)
    axes[-1].set_xlabel("epoch")
    axes[0].legend(fontsize="x-small", ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    # Prefect's temporary server, as before issue 14: nothing left running in the user's
    # PREFECT_HOME (the embedded default would start popflow's local server there)
    os.environ.setdefault("POPFLOW_PREFECT_SERVER", "temporary")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--populations", default="4,16")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--interval", type=int, default=3, help="PBT/PB2 perturbation interval")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    logging.getLogger("popflow").setLevel(logging.WARNING)
    digits = load_example("digits_mlp")
    populations = [int(p) for p in args.populations.split(",")]
    methods = args.methods.split(",")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    from distributed import Client, LocalCluster

    runs: list[dict[str, Any]] = []
    with (
        LocalCluster(n_workers=args.workers, threads_per_worker=1, dashboard_address=":0") as lc,
        Client(lc) as client,
        scratch_dir("popflow-baselines-") as storage,
    ):
        for population in populations:
            for seed in range(args.seeds):
                for method in methods:
                    n = asha_samples(population, args.epochs) if method == "asha" else population
                    start = time.perf_counter()
                    results = digits.tune_digits(
                        method,
                        num_samples=n,
                        epochs=args.epochs,
                        interval=args.interval,
                        seed=seed,
                        storage=storage,
                        name=f"{method}-{population}-{seed}",
                        dask_address=client,
                    )
                    accuracy, loss, epochs = best_of(results)
                    runs.append(
                        {
                            "method": method,
                            "population": population,
                            "seed": seed,
                            "accuracy": accuracy,
                            "log_loss": loss,
                            "epochs": epochs,
                            "errors": results.num_errors,
                            "wall_s": time.perf_counter() - start,
                        }
                    )
                    print(runs[-1], flush=True)
                    if seed == 0 and method in ("pbt", "pb2"):
                        png = RESULTS_DIR / f"pbt_vs_baselines_{stamp}_{method}_{population}.png"
                        RESULTS_DIR.mkdir(exist_ok=True)
                        plot_schedule(
                            results, f"{method.upper()}, population {population}, seed 0", str(png)
                        )
                        print(f"schedule plot: {png}")
    rows, medians = [], {}
    for population in populations:
        for method in methods:
            mine = [r for r in runs if r["method"] == method and r["population"] == population]
            accuracies = [r["accuracy"] for r in mine]
            medians[(method, population)] = statistics.median(accuracies)
            rows.append(
                [
                    method,
                    population,
                    len(mine),
                    summary(accuracies),
                    summary([r["log_loss"] for r in mine]),
                    int(statistics.median(r["epochs"] for r in mine)),
                    sum(r["errors"] for r in mine),
                    statistics.median(r["wall_s"] for r in mine),
                ]
            )
    headers = [
        "method",
        "population",
        "seeds",
        "best val accuracy: median (min-max)",
        "its log loss: median (min-max)",
        "epochs (median)",
        "errored trials",
        "wall s (median)",
    ]
    print(table(headers, rows))
    checks = {}
    for population in populations:
        if ("pbt", population) in medians and ("random", population) in medians:
            ok = medians[("pbt", population)] >= medians[("random", population)]
            checks[f"pbt >= random at {population}"] = ok
            print(f"PBT median >= random search's at population {population}: {verdict(ok)}")
    if ("pb2", 4) in medians and ("pbt", 4) in medians:
        ok = medians[("pb2", 4)] >= medians[("pbt", 4)]
        checks["pb2 >= pbt at 4"] = ok
        print(f"PB2 median >= PBT's at population 4: {verdict(ok)}")
    path = write_json("pbt_vs_baselines", {"args": vars(args), "runs": runs, "checks": checks})
    print(f"figures: {path}")


if __name__ == "__main__":
    main()
