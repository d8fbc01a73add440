"""PBT on a toy problem whose best learning rate is a triangle wave of accuracy.

Ray Tune's ``pbt_example.py`` problem: the optimal lr rises from 0.001 to 0.01
as accuracy goes 0 -> 100, then falls back to 0.001 at 200. A fixed lr cannot
keep up; PBT finds the schedule by copying the best members and perturbing lr.

    python examples/pbt_benchmark.py                 # 8 members, up to 1000 iterations
    python examples/pbt_benchmark.py --smoke-test    # 2 workers, 10 iterations
    python examples/pbt_benchmark.py --storage s3://bucket/prefix --credentials-block my-creds
"""

from __future__ import annotations

import argparse
import logging
import random
from typing import Any

import numpy as np

from popflow import CheckpointConfig, ResultGrid, run, uniform
from popflow.infra.storage.options_cli import add_storage_arguments, resolve_storage_options
from popflow.schedulers import PopulationBasedTraining
from popflow.tasks import Trainable


class PBTBenchmarkExample(Trainable):
    """Accuracy grows fastest when lr is near the optimum for the current accuracy."""

    def setup(self, config: dict[str, Any]) -> None:
        self.lr = config["lr"]
        self.accuracy = 0.0  # the end is 1000

    def step(self) -> dict[str, Any]:
        midpoint = 100  # lr starts decreasing after acc > midpoint
        q_tolerance = 3  # penalize exceeding lr by more than this multiple
        noise_level = 2  # add gaussian noise to the acc increase
        # triangle wave: 0.001 at 0, peak 0.01 at midpoint, 0.001 at 2 * midpoint
        if self.accuracy < midpoint:
            optimal_lr = 0.01 * self.accuracy / midpoint
        else:
            optimal_lr = 0.01 - 0.01 * (self.accuracy - midpoint) / midpoint
        optimal_lr = min(0.01, max(0.001, optimal_lr))

        q_err = max(self.lr, optimal_lr) / min(self.lr, optimal_lr)
        if q_err < q_tolerance:
            self.accuracy += (1.0 / q_err) * random.random()
        elif self.lr > optimal_lr:
            self.accuracy -= (q_err - q_tolerance) * random.random()
        self.accuracy += noise_level * np.random.normal()
        self.accuracy = max(0, self.accuracy)
        return {
            "mean_accuracy": self.accuracy,
            "cur_lr": self.lr,
            "optimal_lr": optimal_lr,  # for debugging
            "q_err": q_err,  # for debugging
            "done": self.accuracy > midpoint * 2,
        }

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {"accuracy": self.accuracy, "lr": self.lr}

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.accuracy = checkpoint["accuracy"]

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self.lr = new_config["lr"]
        self.config = new_config
        return True


def _by_import_path(trainable: type[Trainable]) -> type[Trainable]:
    """Run as a script, the trainable is ``__main__``'s, which JSON cannot name (``popflow
    resume`` would unpickle it): the same class from this file imported as a module is."""
    if trainable.__module__ != "__main__":
        return trainable
    import pbt_benchmark  # the script's folder is on sys.path

    return pbt_benchmark.PBTBenchmarkExample


def run_benchmark(
    *,
    storage: str = "./results",
    name: str = "pbt_benchmark",
    seed: int = 0,
    smoke_test: bool = False,
    synch: bool = False,
    workers: int | None = None,
    resume: bool | str = False,
    max_rounds: int | None = None,
    verbose: int | None = None,
    storage_options: dict[str, Any] | None = None,
    credentials_block: str | None = None,
) -> ResultGrid:
    """The benchmark with the issue's settings (Ray's pbt_example.py); ``storage_options``
    go over those of the Prefect block ``credentials_block`` (S3 ``storage`` only)."""
    perturbation_interval = 5
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=perturbation_interval,
        hyperparam_mutations={
            # distribution for resampling (a search space, as Ray allows: JSON can say it,
            # so `popflow resume` needs no pickle, where it could a lambda)
            "lr": uniform(0.0001, 0.02),
            # allow perturbations within this set of categorical values
            "some_other_factor": [1, 2],
        },
        synch=synch,
    )
    return run(
        _by_import_path(PBTBenchmarkExample),
        param_space={"lr": 0.0001, "some_other_factor": 1},
        scheduler=pbt,
        metric="mean_accuracy",
        mode="max",
        num_samples=8,
        # stop when done=True or at some number of iterations, whichever comes first
        stop={"done": True, "training_iteration": 10 if smoke_test else 1000},
        checkpoint_config=CheckpointConfig(
            checkpoint_frequency=perturbation_interval,
            checkpoint_score_attribute="mean_accuracy",
            num_to_keep=4,
        ),
        name=name,
        storage=storage,
        storage_options=resolve_storage_options(storage, storage_options, credentials_block),
        seed=seed,
        n_workers=2 if smoke_test else workers,
        resume=resume,
        max_rounds=max_rounds,
        verbose=verbose,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke-test", action="store_true", help="2 workers, 10 iterations")
    parser.add_argument("--storage", default="./results", help="local folder or fsspec URL")
    parser.add_argument("--name", default="pbt_benchmark")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=None, help="Dask workers (default: cores)")
    parser.add_argument("--synch", action="store_true", help="synchronous PBT (bit-for-bit)")
    parser.add_argument("--resume", action="store_true", help="continue an interrupted run")
    parser.add_argument(
        "--max-rounds", type=int, default=None, help="end this run after N rounds (resumable)"
    )
    parser.add_argument(
        "--verbose",
        type=int,
        choices=range(4),
        default=None,
        help="0 quiet, 1 status line, 2 trial table (default), 3 also each result and decision",
    )
    add_storage_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    results = run_benchmark(
        storage=args.storage,
        name=args.name,
        seed=args.seed,
        smoke_test=args.smoke_test,
        synch=args.synch,
        workers=args.workers,
        resume=args.resume,
        max_rounds=args.max_rounds,
        verbose=args.verbose,
        storage_options=args.storage_options,
        credentials_block=args.credentials_block,
    )
    best = results.get_best_result()
    print("Best hyperparameters found were:", best.config)
    print(
        f"Best mean_accuracy {best.metrics['mean_accuracy']:.1f} at iteration "
        f"{best.metrics['training_iteration']}; results in {results.experiment_path}"
    )


if __name__ == "__main__":
    main()
