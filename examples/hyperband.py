"""Synchronous HyperBand on the toy loss curve of ``async_hyperband.py``.

HyperBand (Li et al., JMLR 2018) runs successive halving in brackets: every
trial of a bracket trains to the rung's milestone ``r_i`` and waits there
(PAUSE) until its whole cohort has reported; then the best ``n_{i+1}`` go on
and the rest stop. With ``max_t`` R = 100 and η = 3 the first bracket has
rungs at 100/81, 100/27, 100/9, 100/3 and 100 iterations; see
``popflow.schedulers.hyperband_plan``.

A paused trial gives its worker up, so it must be able to resume elsewhere:
the function reports a checkpoint holding its step at every iteration and
starts from ``get_checkpoint()`` when it has one.

    python examples/hyperband.py                 # 20 trials, max_t 100, 2 workers
    python examples/hyperband.py --smoke-test    # 4 trials of 10 steps
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
from typing import Any

from popflow import CheckpointConfig, run
from popflow.infra.storage.options_cli import add_storage_arguments, storage_options_from_args
from popflow.schedulers import HyperBandScheduler, uniform
from popflow.tasks import Checkpoint, get_checkpoint, report

#: seconds one training iteration takes
STEP_S = 0.1


def evaluation_fn(step: int, width: float, height: float) -> float:
    """The loss after ``step`` iterations: falls like ``1 / (width * step)``, offset by height."""
    return (0.1 + width * step / 100) ** -1 + height * 0.1


def easy_objective(config: dict[str, Any]) -> None:
    """``config["steps"]`` iterations of 0.1 s; resumes from the step in its checkpoint."""
    width, height = config["width"], config["height"]
    start = 0
    checkpoint = get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            start = json.load(f)["step"] + 1
    for step in range(start, config["steps"]):
        time.sleep(STEP_S)  # stands in for a training iteration
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"step": step}, f)
            report(
                {"iterations": step, "mean_loss": evaluation_fn(step, width, height)},
                checkpoint=Checkpoint.from_directory(d),
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--smoke-test", action="store_true", help="finish quickly (4 trials of 10 steps)"
    )
    parser.add_argument("--storage", default="./results", help="local folder or fsspec URL")
    parser.add_argument("--name", default=None, help="experiment name (default: timestamped)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2, help="Dask process workers")
    add_storage_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    steps = 10 if args.smoke_test else 100
    num_samples = 4 if args.smoke_test else 20
    scheduler = HyperBandScheduler(time_attr="training_iteration", max_t=min(100, steps))
    for s, bracket in enumerate(scheduler.plan):
        rungs = ", ".join(f"{n} trials to {r:.4g}" for n, r in bracket)
        print(f"HyperBand bracket {s} (s={len(bracket) - 1}): {rungs}")
    name = args.name or f"hyperband_{time.strftime('%Y%m%d-%H%M%S')}"
    start = time.perf_counter()
    results = run(
        easy_objective,
        param_space={"steps": steps, "width": uniform(10, 100), "height": uniform(0, 100)},
        scheduler=scheduler,
        metric="mean_loss",
        mode="min",
        num_samples=num_samples,
        # a checkpoint per iteration: keep the newest two (and any a trial resumes from)
        checkpoint_config=CheckpointConfig(num_to_keep=2),
        storage=args.storage,
        storage_options=storage_options_from_args(args),
        name=name,
        seed=args.seed,
        n_workers=args.workers,
    )
    wall = time.perf_counter() - start

    best = results.get_best_result()
    last = sorted(int(r.metrics.get("training_iteration", 0)) for r in results)
    print("Best hyperparameters found were:", best.config)
    print(
        f"Best mean_loss {best.metrics['mean_loss']:.4f} at iteration "
        f"{best.metrics['training_iteration']}; results in {results.experiment_path}"
    )
    print(f"Iterations per trial (HyperBand stopped the rest at rungs): {last}")
    print(f"{len(results)} trials, {sum(last)} iterations in {wall:.1f} s (run wall time)")


if __name__ == "__main__":
    main()
