"""The Ray Tune side of the benchmarks: the same workloads, run with Ray Tune.

Written from the workloads' descriptions (see ``examples/``), not copied
from Ray. Run by the benchmarks as a subprocess with the project venv's
``ray`` (``pip install -e ".[bench]"``); prints one ``RESULT_JSON`` line.

    python benchmarks/ray_side.py pbt --seed 0            # examples/pbt_benchmark.py's problem
    python benchmarks/ray_side.py asha --seed 0           # examples/async_hyperband.py's workload
    python benchmarks/ray_side.py pbt-noop --iterations 60 --synch [--members 256]
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()  # before importing ray: the script wall includes imports

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import tempfile  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import ray  # noqa: E402
from ray import tune  # noqa: E402
from ray.tune.schedulers import AsyncHyperBandScheduler, PopulationBasedTraining  # noqa: E402

RESULT_PREFIX = "RESULT_JSON "


def emit(result: dict[str, Any]) -> None:
    print(RESULT_PREFIX + json.dumps(result, default=str), flush=True)


# -- the PBT problem (examples/pbt_benchmark.py) --------------------------------------------
def best_lr(accuracy: float) -> float:
    """The triangle wave: 0.001 at accuracy 0, 0.01 at 100, 0.001 again at 200."""
    lr = 0.01 * accuracy / 100 if accuracy < 100 else 0.01 - 0.01 * (accuracy - 100) / 100
    return min(0.01, max(0.001, lr))


def _count_step(config: dict[str, Any]) -> None:
    """Append one byte per step() call to ``config["step_log"]``: the real number of steps.

    Ray's per-trial result logs miss rows under PBT with ``reuse_actors`` (a
    trial's results between a pause and its next exploit), so their length
    undercounts the training done; this file does not.
    """
    path = config.get("step_log")
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, b".")
        finally:
            os.close(fd)


class TriangleWave(tune.Trainable):
    """Accuracy grows by up to 1/q per step while lr is within a factor 3 of the optimum."""

    def setup(self, config: dict[str, Any]) -> None:
        seed = config.get("seed")
        if seed is not None:  # a repeatable stream per (seed, trial), as popflow seeds segments
            index = int(str(self.trial_id).rsplit("_", 1)[-1])
            random.seed(seed * 1000 + index)
            np.random.seed(seed * 1000 + index)
        self.lr = config["lr"]
        self.accuracy = 0.0
        # step() calls in this lineage (restored with the checkpoint): a cross-check of
        # the training_iteration Ray reports
        self.steps = 0

    def step(self) -> dict[str, Any]:
        self.steps += 1
        _count_step(self.config)
        optimum = best_lr(self.accuracy)
        q_err = max(self.lr, optimum) / min(self.lr, optimum)
        if q_err < 3:
            self.accuracy += random.random() / q_err
        elif self.lr > optimum:
            self.accuracy -= (q_err - 3) * random.random()
        self.accuracy = max(0.0, self.accuracy + 2 * np.random.normal())
        return {
            "mean_accuracy": self.accuracy,
            "cur_lr": self.lr,
            "optimal_lr": optimum,
            "q_err": q_err,
            "done": self.accuracy > 200,
            "lineage_steps": self.steps,
        }

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {"accuracy": self.accuracy, "lr": self.lr, "steps": self.steps}

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.accuracy = checkpoint["accuracy"]
        self.steps = checkpoint["steps"]

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self.lr = new_config["lr"]
        self.config = new_config
        return True


def iterations_to_done(
    results: Any, threshold: float = 200.0, column: str = "training_iteration"
) -> int | None:
    """Smallest training_iteration at which any trial reported mean_accuracy > threshold.

    Ray marks every trial's final result ``done``, so the example's own
    criterion is used rather than the ``done`` column.
    """
    found = None
    for r in results:
        df = r.metrics_dataframe
        if df is None or len(df) == 0 or "mean_accuracy" not in df:
            continue
        hits = df[df["mean_accuracy"] > threshold]
        if len(hits):
            it = int(hits[column].min())
            found = it if found is None else min(found, it)
    return found


def run_pbt(args: argparse.Namespace, storage: str) -> dict[str, Any]:
    random.seed(args.seed)
    np.random.seed(args.seed)
    scheduler = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=5,
        hyperparam_mutations={
            "lr": lambda: random.uniform(0.0001, 0.02),
            "some_other_factor": [1, 2],
        },
    )
    tuner = tune.Tuner(
        TriangleWave,
        param_space={
            "lr": 0.0001,
            "some_other_factor": 1,
            "seed": args.seed,
            "step_log": os.path.join(storage, "steps.log"),
        },
        tune_config=tune.TuneConfig(
            scheduler=scheduler,
            metric="mean_accuracy",
            mode="max",
            num_samples=8,
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=f"ray_pbt_seed{args.seed}",
            storage_path=storage,
            stop={"done": True, "training_iteration": args.stop},
            verbose=0,
            checkpoint_config=tune.CheckpointConfig(
                checkpoint_frequency=5,
                checkpoint_score_attribute="mean_accuracy",
                num_to_keep=4,
            ),
        ),
    )
    start = time.perf_counter()
    results = tuner.fit()
    fit = time.perf_counter() - start
    best = results.get_best_result()
    steps_file = os.path.join(storage, "steps.log")
    return {
        "fit_wall_s": fit,
        "steps": os.path.getsize(steps_file) if os.path.exists(steps_file) else None,
        "iterations_to_done": iterations_to_done(results),
        "lineage_steps_to_done": iterations_to_done(results, column="lineage_steps"),
        "best_mean_accuracy": float(best.metrics["mean_accuracy"]),
        "errored_trials": len(results.errors),
        "result_rows": sum(len(r.metrics_dataframe) for r in results),
    }


# -- the ASHA workload (examples/async_hyperband.py) ----------------------------------------
def easy_objective(config: dict[str, Any]) -> None:
    width, height = config["width"], config["height"]
    for step in range(config["steps"]):
        time.sleep(0.1)
        loss = (0.1 + width * step / 100) ** -1 + height * 0.1
        tune.report({"iterations": step, "mean_loss": loss})


def run_asha(args: argparse.Namespace, storage: str) -> dict[str, Any]:
    np.random.seed(args.seed)  # ASHA's bracket draw and tune.uniform use the global generator
    tuner = tune.Tuner(
        tune.with_resources(easy_objective, {"cpu": 1}),
        param_space={
            "steps": args.steps,
            "width": tune.uniform(10, 100),
            "height": tune.uniform(0, 100),
        },
        tune_config=tune.TuneConfig(
            scheduler=AsyncHyperBandScheduler(grace_period=5, max_t=args.max_t),
            metric="mean_loss",
            mode="min",
            num_samples=args.num_samples,
        ),
        run_config=tune.RunConfig(name="ray_asha", storage_path=storage, verbose=0),
    )
    start = time.perf_counter()
    results = tuner.fit()
    fit = time.perf_counter() - start
    last = sorted(int(r.metrics["training_iteration"]) for r in results)
    return {
        "fit_wall_s": fit,
        "per_trial_iterations": last,
        "total_iterations": sum(last),
        "best_mean_loss": float(results.get_best_result().metrics["mean_loss"]),
        "errored_trials": len(results.errors),
    }


# -- per-round overhead: a no-op population --------------------------------------------------
class Noop(tune.Trainable):
    def setup(self, config: dict[str, Any]) -> None:
        self.count = 0

    def step(self) -> dict[str, Any]:
        self.count += self.config["c"]
        return {"score": self.count}

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {"count": self.count}

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.count = checkpoint["count"]

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self.config = new_config
        return True


def run_pbt_noop(args: argparse.Namespace, storage: str) -> dict[str, Any]:
    random.seed(args.seed)
    np.random.seed(args.seed)
    walls = {}
    for iterations in (1, args.iterations):
        tuner = tune.Tuner(
            Noop,
            param_space={},  # PBT samples c from the mutations
            tune_config=tune.TuneConfig(
                scheduler=PopulationBasedTraining(
                    time_attr="training_iteration",
                    perturbation_interval=1,
                    hyperparam_mutations={"c": [1, 2]},
                    synch=args.synch,
                ),
                metric="score",
                mode="max",
                num_samples=args.members,
                reuse_actors=True,
            ),
            run_config=tune.RunConfig(
                name=f"ray_noop_{iterations}",
                storage_path=storage,
                stop={"training_iteration": iterations},
                verbose=0,
            ),
        )
        start = time.perf_counter()
        tuner.fit()
        walls[iterations] = time.perf_counter() - start
    return {
        "wall_1_s": walls[1],
        "wall_n_s": walls[args.iterations],
        "rounds": args.iterations,
        "per_round_s": (walls[args.iterations] - walls[1]) / (args.iterations - 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("workload", choices=["pbt", "asha", "pbt-noop"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--stop", type=int, default=1000, help="pbt: iteration cap")
    parser.add_argument("--num-samples", type=int, default=20, help="asha")
    parser.add_argument("--steps", type=int, default=100, help="asha")
    parser.add_argument("--max-t", type=int, default=100, help="asha")
    parser.add_argument("--iterations", type=int, default=60, help="pbt-noop")
    parser.add_argument("--synch", action="store_true", help="pbt-noop")
    parser.add_argument("--members", type=int, default=8, help="pbt-noop")
    args = parser.parse_args()

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    init_start = time.perf_counter()
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    init = time.perf_counter() - init_start
    run = {"pbt": run_pbt, "asha": run_asha, "pbt-noop": run_pbt_noop}[args.workload]
    with tempfile.TemporaryDirectory(prefix="popflow-bench-ray-") as storage:
        result = run(args, storage)
    ray.shutdown()
    emit({**result, "ray_init_s": init, "script_wall_s": time.perf_counter() - _T0})


if __name__ == "__main__":
    main()
