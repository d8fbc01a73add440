"""The PBT benchmark written with the function API: ``report`` and ``get_checkpoint``.

Same triangle-wave problem as ``pbt_benchmark.py``. The function resumes from
``get_checkpoint()`` and reports a checkpoint every iteration, so PBT can clone
any member at any perturbation point.

    python examples/pbt_function.py --smoke-test
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import tempfile
from typing import Any

import numpy as np

from popflow import CheckpointConfig, run
from popflow.infra.storage.options_cli import add_storage_arguments, storage_options_from_args
from popflow.schedulers import PopulationBasedTraining, uniform
from popflow.tasks import Checkpoint, get_checkpoint, report


def optimal_lr(accuracy: float, midpoint: float = 100) -> float:
    """The triangle wave: 0.001 at 0, 0.01 at ``midpoint``, back to 0.001 at twice that."""
    if accuracy < midpoint:
        lr = 0.01 * accuracy / midpoint
    else:
        lr = 0.01 - 0.01 * (accuracy - midpoint) / midpoint
    return min(0.01, max(0.001, lr))


def pbt_function(config: dict[str, Any]) -> None:
    lr, accuracy, step = config["lr"], 0.0, 0
    checkpoint = get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            state = json.load(f)
        accuracy, step = state["accuracy"], state["step"]
    while True:
        step += 1
        best = optimal_lr(accuracy)
        q_err = max(lr, best) / min(lr, best)
        if q_err < 3:
            accuracy += (1.0 / q_err) * random.random()
        elif lr > best:
            accuracy -= (q_err - 3) * random.random()
        accuracy = max(0.0, accuracy + 2 * np.random.normal())
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"accuracy": accuracy, "step": step}, f)
            report(
                {"mean_accuracy": accuracy, "cur_lr": lr, "done": accuracy > 200},
                checkpoint=Checkpoint.from_directory(d),
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--smoke-test", action="store_true", help="finish quickly (2 workers, 10 iterations)"
    )
    parser.add_argument("--storage", default="./results")
    parser.add_argument("--name", default="pbt_function")
    parser.add_argument("--seed", type=int, default=0)
    add_storage_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    scheduler = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=5,
        hyperparam_mutations={"lr": uniform(0.0001, 0.02), "some_other_factor": [1, 2]},
    )
    results = run(
        pbt_function,
        param_space={"lr": 0.0001, "some_other_factor": 1},
        scheduler=scheduler,
        metric="mean_accuracy",
        mode="max",
        num_samples=8,
        stop={"done": True, "training_iteration": 10 if args.smoke_test else 1000},
        checkpoint_config=CheckpointConfig(
            num_to_keep=4, checkpoint_score_attribute="mean_accuracy"
        ),
        name=args.name,
        storage=args.storage,
        storage_options=storage_options_from_args(args),
        seed=args.seed,
        n_workers=2 if args.smoke_test else None,
    )
    best = results.get_best_result()
    print("Best hyperparameters found were:", best.config)
    print(
        f"Best mean_accuracy {best.metrics['mean_accuracy']:.1f} at iteration "
        f"{best.metrics['training_iteration']}; results in {results.experiment_path}"
    )


if __name__ == "__main__":
    main()
