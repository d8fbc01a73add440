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
    .venv/bin/python benchmarks/search_quality.py --tasks taxi --methods pbt,pb2 \
        --first-seed 5 --seeds 40                                   # seeds 5-44

Claims tested (reported, whatever they say): PBT >= random search and ASHA; PB2 >= PBT at
this small population. Each is judged on the medians, and printed with how much the seeds
back it: the chance that a seed of one method beats a seed of the other, and the
one-sided Mann-Whitney U p-value (with 5 seeds a median can turn on one seed).

``--peer ray`` runs the same tasks, seeds and schedulers on Ray Tune instead (the bench
extra; PBT and PB2 by default): the trainable's methods in a ``ray.tune.Trainable``,
the same search spaces and scheduler arguments in Ray's classes, ``random`` and ``numpy``
seeded per seed as Ray's docs advise, 2 CPUs. Where popflow's PBT or PB2 loses, this says
whether Ray's does too (the method) or not (popflow).

    .venv/bin/python benchmarks/search_quality.py --peer ray --methods pbt,pb2
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


def to_ray_domain(value: Any) -> Any:
    """popflow's search-space domain as Ray's (the same class names and arguments)."""
    from ray import tune as ray_tune

    from popflow.schedulers import domains

    if isinstance(value, domains.LogUniform):
        return ray_tune.loguniform(value.lower, value.upper, base=value.base)
    if isinstance(value, domains.Uniform):
        return ray_tune.uniform(value.lower, value.upper)
    if isinstance(value, domains.RandInt):
        return ray_tune.randint(value.lower, value.upper)
    if isinstance(value, domains.Categorical):
        return ray_tune.choice(list(value.categories))
    if isinstance(value, dict):
        return {k: to_ray_domain(v) for k, v in value.items()}
    if isinstance(value, domains.Domain):
        raise TypeError(f"no Ray counterpart written for {value!r}")
    return value


def ray_scheduler(task: Task, method: str) -> Any:
    """Ray's scheduler built from the same arguments as popflow's for ``method``."""
    from ray.tune.schedulers import ASHAScheduler as RayASHA
    from ray.tune.schedulers import FIFOScheduler as RayFIFO
    from ray.tune.schedulers import PopulationBasedTraining as RayPBT
    from ray.tune.schedulers.pb2 import PB2 as RayPB2

    if method == "random":
        return RayFIFO()
    if method == "asha":
        return RayASHA(max_t=task.iterations, grace_period=2, reduction_factor=4)
    kwargs = dict(task.make_scheduler(method, task.interval, synch=True).init_args[1])
    if "hyperparam_mutations" in kwargs:
        kwargs["hyperparam_mutations"] = to_ray_domain(kwargs["hyperparam_mutations"])
    return (RayPB2 if method == "pb2" else RayPBT)(**kwargs)


def ray_trainable(task: Task) -> type:
    """The task's trainable as a ``ray.tune.Trainable`` (popflow's has Ray's methods): each
    method from the first class that defines it, passing over one that calls ``super()``
    (only ``TimedPPO.step``, which adds ``wall``: every step here does)."""
    from ray import tune as ray_tune

    methods: dict[str, Any] = {}
    for klass in task.trainable.__mro__:
        if klass.__module__.startswith("popflow"):
            break
        for name, value in vars(klass).items():
            code = getattr(value, "__code__", None)
            if name in methods or name.startswith("__") or code is None:
                continue
            if "__class__" in code.co_freevars:  # zero-argument super(): the base's is used
                continue
            methods[name] = value
    step = methods["step"]

    def timed_step(self: Any) -> dict[str, Any]:
        return {"wall": time.time(), **step(self)}

    methods["step"] = timed_step
    return type(f"Ray{task.trainable.__name__}", (ray_tune.Trainable,), methods)


def ray_run(task: Task, method: str, seed: int, storage: str) -> tuple[Any, Any]:
    """One run on Ray Tune: (its results, in popflow's shape for :func:`curve`; the best
    result)."""
    import random

    import numpy as np
    from ray import tune as ray_tune

    random.seed(seed)  # Ray's docs: seed these before Tuner for repeatable sampling
    np.random.seed(seed)
    n = asha_samples(task.population, task.iterations) if method == "asha" else task.population
    tuner = ray_tune.Tuner(
        ray_trainable(task),
        param_space=to_ray_domain(task.space),
        tune_config=ray_tune.TuneConfig(
            scheduler=ray_scheduler(task, method),
            metric=task.metric,
            mode="max",
            num_samples=n,
        ),
        run_config=ray_tune.RunConfig(
            name=f"{task.name}-{method}-{seed}",
            storage_path=storage,
            stop={"training_iteration": task.iterations},
            # every checkpoint kept: with num_to_keep=1 (popflow's setting here), Ray's PBT
            # deletes a checkpoint an exploit is about to restore ("does not exist on
            # storage anymore") and the trial errors
            checkpoint_config=ray_tune.CheckpointConfig(checkpoint_at_end=True),
            verbose=0,
        ),
    )
    grid = tuner.fit()
    histories = [argparse.Namespace(history=r.metrics_dataframe.to_dict("records")) for r in grid]
    return histories, grid.get_best_result(task.metric, "max")


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


def score(task: Task, method: str, seed: int, results: Any, best: Any, start: float,
          errors: int) -> dict[str, Any]:  # fmt: skip
    """One run's row: the best member's final score (and regret or evaluation)."""
    run = {
        "task": task.name,
        "method": method,
        "seed": seed,
        "score": best.metrics[task.metric],
        "iterations": sum(len(list(r.history)) for r in results),
        "errors": errors,
        "wall_s": time.perf_counter() - start,
    }
    if task.name == "taxi":
        import taxi_q

        run["regret"] = taxi_q.optimum() - run["score"]
    if task.name == "ppo":
        ppo = load_example("ppo_pbt")
        run["eval"] = ppo.evaluate(best.checkpoint, 10, seed)[0]
    return run


def pb2_rows(pb2: Any) -> dict[str, Any]:
    """PB2's data rows at the run's end (``[t, h..., r]`` per logged result or exploit, in
    logging order), the trials they belong to and each column's bounds (None: categorical)."""
    state = pb2.get_state()["pb2"]
    bounds = {
        "/".join(p.path): None if p.categories is not None else [p.low, p.high] for p in pb2._params
    }
    return {"trials": state["row_trials"], "rows": state["rows"], "bounds": bounds}


def better_odds(first: list[float], second: list[float]) -> tuple[float, float]:
    """How often a seed of ``first`` beats one of ``second`` (ties count half: the common
    language effect size) and the one-sided Mann-Whitney U p-value that it does not: with
    5 seeds a median can flip on one seed, this says how much the seeds back it."""
    from scipy.stats import mannwhitneyu

    u, p = mannwhitneyu(first, second, alternative="greater")
    return float(u) / (len(first) * len(second)), float(p)


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("POPFLOW_PREFECT_SERVER", "temporary")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", default="taxi,ppo")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0,
                        help="seeds first-seed .. first-seed + seeds - 1")  # fmt: skip
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--peer", choices=["ray"], help="run on Ray Tune instead")
    args = parser.parse_args(argv)
    if args.peer == "ray":
        import ray

        # Ray's workers import the example and task modules by name (its pickler does
        # not take cloudpickle's by-value registrations)
        here = os.path.dirname(os.path.abspath(__file__))
        path = [os.path.join(here, "..", "examples"), here, os.environ.get("PYTHONPATH", "")]
        ray.init(
            num_cpus=args.workers,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in path if p)}},
        )
    logging.getLogger("popflow").setLevel(logging.WARNING)
    methods = args.methods.split(",")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    from distributed import Client, LocalCluster

    runs: list[dict[str, Any]] = []
    checks: dict[str, bool] = {}
    odds: dict[str, tuple[float, float]] = {}
    with (
        LocalCluster(n_workers=args.workers, threads_per_worker=1, dashboard_address=":0") as lc,
        Client(lc) as client,
        scratch_dir("popflow-search-quality-") as storage,
    ):
        for task_name in args.tasks.split(","):
            task = TASKS[task_name]()
            curves: dict[str, list[list[float]]] = {m: [] for m in methods}
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                for method in methods:
                    n = (asha_samples(task.population, task.iterations)
                         if method == "asha" else task.population)  # fmt: skip
                    start = time.perf_counter()
                    if args.peer == "ray":
                        results, best = ray_run(task, method, seed, storage)
                        runs.append(score(task, method, seed, results, best, start, 0))
                        curves[method].append(curve(results, task.metric))
                        print(runs[-1], flush=True)
                        continue
                    sched = scheduler(task, method)
                    results = popflow.run(
                        task.trainable,
                        param_space=task.space,
                        scheduler=sched,
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
                    runs.append(score(task, method, seed, results, best, start,
                                      results.num_errors))  # fmt: skip
                    curves[method].append(curve(results, task.metric))
                    print(runs[-1], flush=True)
                    if method == "pb2":  # its GP's data, for pb2_parity.py --rows
                        runs[-1]["pb2_rows"] = pb2_rows(sched)
            RESULTS_DIR.mkdir(exist_ok=True)
            png = RESULTS_DIR / f"search_quality_{stamp}_{task.name}.png"
            plot(task, curves, str(png))
            print(f"best-so-far plot: {png}")
            scores = {
                m: [r["score"] for r in runs if r["task"] == task.name and r["method"] == m]
                for m in methods
            }
            for better, worse in [("pbt", "random"), ("pbt", "asha"), ("pb2", "pbt")]:
                if better in scores and worse in scores:
                    ok = statistics.median(scores[better]) >= statistics.median(scores[worse])
                    checks[f"{task.name}: {better} >= {worse}"] = ok
                    odds[f"{task.name}: {better} >= {worse}"] = better_odds(
                        scores[better], scores[worse]
                    )
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
        share, p = odds[name]
        print(
            f"{name} (medians): {verdict(ok)}; P(a seed of the first beats one of the "
            f"second) = {share:.2f}, one-sided Mann-Whitney p = {p:.3f}"
        )
    path = write_json("search_quality", {"args": vars(args), "runs": runs, "checks": checks,
                                         "odds": odds})  # fmt: skip
    print(f"figures: {path}")


if __name__ == "__main__":
    main()
