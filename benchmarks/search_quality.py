"""Random search, ASHA, PBT and PB2 at equal compute on two tasks where the best settings
change during training, with best-so-far curves against compute.

Tasks:

- ``ppo``: ``examples/ppo_pbt.py``'s PPO (stable-baselines3) on Pendulum-v1; PBT and PB2
  tune the learning rate, clip range, discount and GAE lambda (PBT also the entropy
  coefficient, minibatch size and epochs); an iteration is one rollout of 4 x 1024 steps;
  the score is SB3's mean training return of the last 100 episodes, and the best member's
  final checkpoint is also evaluated on 10 deterministic episodes.
- ``taxi``: ``benchmarks/taxi_q.py``'s tabular Q-learning on Taxi-v4, tuning the step size,
  epsilon and discount; an iteration is 2,000 steps; the score is the exact expected
  return of the policy the agent acts with, so regret against the computed optimum is
  exact.

Every method gets the same compute, ``population x iterations`` training iterations:
random search (FIFO) and PBT/PB2 train ``population`` members for ``iterations`` each;
ASHA (grace 2, reduction 4) samples as many trials as that buys
(``pbt_vs_baselines.asha_samples``) and stops most early. PBT and PB2 are synchronous
(``synch=True``): with more members than the 2 worker slots, asynchronous PBT would
train the first two members to the end before the others start. Each (task, method)
runs ``--seeds`` seeds; the table gives the best member's final score, median (min-max).
The best-so-far curve (the best score any trial has reported, against the iterations
trained so far across the run, in the order they were reported; median over seeds) is
drawn per task to ``bench-results/search_quality_<time>_<task>.png``.

    .venv/bin/python benchmarks/search_quality.py                   # both tasks, 5 seeds
    .venv/bin/python benchmarks/search_quality.py --tasks taxi --seeds 2

Claims tested (reported, whatever they say): PBT >= random search and ASHA; PB2 >= PBT at
this small population.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

from common import RESULTS_DIR, load_example, scratch_dir, table, verdict, write_json
from pbt_vs_baselines import asha_samples

import popflow
from popflow.schedulers import ASHAScheduler, FIFOScheduler

METHODS = ("random", "asha", "pbt", "pb2")


@dataclass(frozen=True)
class Task:
    name: str
    trainable: Any
    space: dict[str, Any]
    make_scheduler: Any  # (method, interval, synch) -> PBT or PB2
    metric: str
    population: int
    iterations: int
    interval: int
    steps_per_iteration: int


def ppo_task() -> Task:
    ppo = load_example("ppo_pbt")
    args = argparse.Namespace(n_envs=4, n_steps=1024)

    class TimedPPO(ppo.PPOTrainable):
        def step(self) -> dict[str, Any]:
            return {**super().step(), "wall": time.time()}

    return Task("ppo", TimedPPO, ppo.param_space(args), ppo.make_scheduler,
                "episode_reward_mean", 4, 12, 3, 4096)  # fmt: skip


def taxi_task() -> Task:
    import cloudpickle
    import taxi_q

    cloudpickle.register_pickle_by_value(taxi_q)
    return Task("taxi", taxi_q.TaxiQ, taxi_q.param_space(), taxi_q.make_scheduler,
                "mean_return", 8, 25, 3, taxi_q.STEPS)  # fmt: skip


TASKS = {"ppo": ppo_task, "taxi": taxi_task}


def scheduler(task: Task, method: str) -> Any:
    if method == "random":
        return FIFOScheduler()
    if method == "asha":
        return ASHAScheduler(max_t=task.iterations, grace_period=2, reduction_factor=4)
    return task.make_scheduler(method, task.interval, synch=True)


def curve(results: Any, metric: str) -> list[float]:
    """The best score reported so far after each training iteration of the run (all
    trials' results in the order their trials reported them)."""
    rows = sorted((h["wall"], h[metric]) for r in results for h in r.history)
    best, out = float("-inf"), []
    for _, score in rows:
        best = max(best, score)
        out.append(best)
    return out


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f} to {max(values):.2f})"


def plot(task: Task, curves: dict[str, list[list[float]]], path: str) -> None:
    """Best so far against compute; for Taxi, its regret on a log scale (the scores near
    the optimum are what tell the methods apart)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    if task.name == "taxi":
        import taxi_q

        best = taxi_q.optimum()
        curves = {m: [[best - v for v in c] for c in runs] for m, runs in curves.items()}
        ax.set_yscale("log")
        ylabel = "regret of the best so far (optimum - expected return)"
    else:
        ylabel = f"best {task.metric} so far"
    for method, runs in curves.items():
        length = min(len(c) for c in runs)
        xs = [(i + 1) * task.steps_per_iteration for i in range(length)]
        median = [statistics.median(c[i] for c in runs) for i in range(length)]
        low = [min(c[i] for c in runs) for i in range(length)]
        high = [max(c[i] for c in runs) for i in range(length)]
        (line,) = ax.plot(xs, median, label=method)
        ax.fill_between(xs, low, high, alpha=0.15, color=line.get_color())
    ax.set_xlabel("environment steps trained, all members")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{task.name}: median and range over seeds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("POPFLOW_PREFECT_SERVER", "temporary")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default="taxi,ppo")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    logging.getLogger("popflow").setLevel(logging.WARNING)
    methods = args.methods.split(",")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    from distributed import Client, LocalCluster

    runs: list[dict[str, Any]] = []
    checks: dict[str, bool] = {}
    with (
        LocalCluster(n_workers=args.workers, threads_per_worker=1, dashboard_address=":0") as lc,
        Client(lc) as client,
        scratch_dir("popflow-search-quality-") as storage,
    ):
        for task_name in args.tasks.split(","):
            task = TASKS[task_name]()
            curves: dict[str, list[list[float]]] = {m: [] for m in methods}
            for seed in range(args.seeds):
                for method in methods:
                    n = (asha_samples(task.population, task.iterations)
                         if method == "asha" else task.population)  # fmt: skip
                    start = time.perf_counter()
                    results = popflow.run(
                        task.trainable,
                        param_space=task.space,
                        scheduler=scheduler(task, method),
                        metric=task.metric,
                        mode="max",
                        num_samples=n,
                        stop={"training_iteration": task.iterations},
                        checkpoint_config=popflow.CheckpointConfig(
                            num_to_keep=1, checkpoint_at_end=True
                        ),
                        seed=seed,
                        storage=storage,
                        name=f"{task.name}-{method}-{seed}",
                        dask_address=client,
                        verbose=0,
                    )
                    best = results.get_best_result(task.metric, "max")
                    run = {
                        "task": task.name,
                        "method": method,
                        "seed": seed,
                        "score": best.metrics[task.metric],
                        "iterations": sum(len(list(r.history)) for r in results),
                        "errors": results.num_errors,
                        "wall_s": time.perf_counter() - start,
                    }
                    if task.name == "taxi":
                        import taxi_q

                        run["regret"] = taxi_q.optimum() - run["score"]
                    if task.name == "ppo":
                        ppo = load_example("ppo_pbt")
                        run["eval"] = ppo.evaluate(best.checkpoint, 10, seed)[0]
                    runs.append(run)
                    curves[method].append(curve(results, task.metric))
                    print(run, flush=True)
            RESULTS_DIR.mkdir(exist_ok=True)
            png = RESULTS_DIR / f"search_quality_{stamp}_{task.name}.png"
            plot(task, curves, str(png))
            print(f"best-so-far plot: {png}")
            medians = {
                m: statistics.median(r["score"] for r in runs
                                     if r["task"] == task.name and r["method"] == m)
                for m in methods
            }  # fmt: skip
            for better, worse in [("pbt", "random"), ("pbt", "asha"), ("pb2", "pbt")]:
                if better in medians and worse in medians:
                    ok = medians[better] >= medians[worse]
                    checks[f"{task.name}: {better} >= {worse}"] = ok
    rows = []
    for task_name in args.tasks.split(","):
        for method in methods:
            mine = [r for r in runs if r["task"] == task_name and r["method"] == method]
            extra = ""
            if task_name == "taxi":
                extra = "regret " + summary([r["regret"] for r in mine])
            if task_name == "ppo":
                extra = "eval " + summary([r["eval"] for r in mine])
            rows.append([
                task_name, method, len(mine), summary([r["score"] for r in mine]), extra,
                int(statistics.median(r["iterations"] for r in mine)),
                sum(r["errors"] for r in mine), statistics.median(r["wall_s"] for r in mine),
            ])  # fmt: skip
    headers = ["task", "method", "seeds", "best final score: median (range)", "also",
               "iterations (median)", "errored trials", "wall s (median)"]  # fmt: skip
    print(table(headers, rows))
    for name, ok in checks.items():
        print(f"{name} (medians): {verdict(ok)}")
    path = write_json("search_quality", {"args": vars(args), "runs": runs, "checks": checks})
    print(f"figures: {path}")


if __name__ == "__main__":
    main()
