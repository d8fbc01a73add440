"""ASHA (asynchronous successive halving) on a toy loss curve, with the function API.

The workload of Ray Tune's ``async_hyperband_example``: each trial trains for
``steps`` iterations of 0.1 s; its loss ``(0.1 + width * step / 100) ** -1 +
height / 10`` falls faster for a wide, low trial. ASHA (grace period 5, max_t
100, reduction factor 4) stops the trials below the top quarter at each rung
(5, 20, 80 iterations) as soon as their result arrives; no trial ever waits
for another.

The function reports no checkpoints: a trial that passes a rung goes on in
the same Python call (popflow keeps it alive on its worker between rungs).

    python examples/async_hyperband.py                 # 20 trials, 2 workers
    python examples/async_hyperband.py --smoke-test    # 4 trials of 10 steps
"""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

from popflow import run
from popflow.infra.storage.options_cli import add_storage_arguments, storage_options_from_args
from popflow.schedulers import ASHAScheduler, uniform
from popflow.tasks import report

#: seconds one training iteration takes
STEP_S = 0.1


def evaluation_fn(step: int, width: float, height: float) -> float:
    """The loss after ``step`` iterations: falls like ``1 / (width * step)``, offset by height."""
    return (0.1 + width * step / 100) ** -1 + height * 0.1


def easy_objective(config: dict[str, Any]) -> None:
    """One trial: ``config["steps"]`` iterations of 0.1 s, reporting ``mean_loss`` each."""
    width, height = config["width"], config["height"]
    for step in range(config["steps"]):
        time.sleep(STEP_S)  # stands in for a training iteration
        report({"iterations": step, "mean_loss": evaluation_fn(step, width, height)})


def make_scheduler(max_t: int = 100, grace_period: int = 5) -> ASHAScheduler:
    return ASHAScheduler(time_attr="training_iteration", grace_period=grace_period, max_t=max_t)


def param_space(steps: int) -> dict[str, Any]:
    return {"steps": steps, "width": uniform(10, 100), "height": uniform(0, 100)}


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
    name = args.name or f"asynchyperband_{time.strftime('%Y%m%d-%H%M%S')}"
    start = time.perf_counter()
    results = run(
        easy_objective,
        param_space=param_space(steps),
        scheduler=make_scheduler(max_t=min(100, steps)),
        metric="mean_loss",
        mode="min",
        num_samples=num_samples,
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
    print(f"Iterations per trial (ASHA stopped the rest early): {last}")
    print(f"{len(results)} trials, {sum(last)} iterations in {wall:.1f} s (run wall time)")


if __name__ == "__main__":
    main()
