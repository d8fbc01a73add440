"""What would other schedulers have spent on a finished run? Its curves, replayed.

``popflow.simulate(curves_from=...)`` replays each trial of a finished experiment, row by
row, with the time each iteration took then, under another scheduler, in this process on a
virtual clock (seconds, no cluster). A replayed trial ends where its recorded curve ends, so
the answer is what each scheduler would have *cut* from this run.

    python examples/replay_schedulers.py                        # runs async_hyperband.py's
                                                                # ASHA experiment, then replays it
    python examples/replay_schedulers.py ./results/my_run       # replays a finished experiment
    python examples/replay_schedulers.py --smoke-test           # 4 trials of 10 steps
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import popflow
from popflow import FIFOScheduler, HyperBandScheduler, MedianStoppingRule
from popflow.schedulers import ASHAScheduler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def record_asha(storage: str, smoke_test: bool) -> str:
    """async_hyperband.py's ASHA experiment on the embedded default; its folder."""
    from async_hyperband import easy_objective, make_scheduler, param_space

    steps = 10 if smoke_test else 100
    name = f"asha_to_replay_{time.strftime('%Y%m%d-%H%M%S')}"
    results = popflow.run(
        easy_objective,
        param_space=param_space(steps),
        scheduler=make_scheduler(max_t=steps, grace_period=2 if smoke_test else 5),
        metric="mean_loss",
        mode="min",
        num_samples=4 if smoke_test else 20,
        storage=storage,
        name=name,
        seed=0,
        verbose=1,
    )
    return results.experiment_path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("experiment", nargs="?", help="a finished experiment's folder")
    parser.add_argument("--storage", default="./results", help="where a new run goes")
    parser.add_argument("--slots", type=int, default=2, help="trials at once in the replay")
    parser.add_argument("--smoke-test", action="store_true", help="4 trials of 10 steps")
    args = parser.parse_args(argv)

    path = args.experiment or record_asha(args.storage, args.smoke_test)
    recorded = popflow.ResultGrid.from_path(path)
    horizon = max(int(r.metrics.get("training_iteration", 0)) for r in recorded)
    schedulers = {
        "as recorded (FIFO)": FIFOScheduler(),
        "ASHA": ASHAScheduler(time_attr="training_iteration", max_t=horizon, grace_period=5),
        "HyperBand": HyperBandScheduler(time_attr="training_iteration", max_t=horizon),
        "median stopping": MedianStoppingRule(time_attr="training_iteration", grace_period=5),
    }
    print(f"replaying {path} ({len(recorded)} trials, {args.slots} slots)")
    print(f"{'scheduler':<20} {'iterations':>10} {'busy s':>8} {'wall s':>8} {'best':>10}")
    for label, scheduler in schedulers.items():
        start = time.perf_counter()
        sim = popflow.simulate(curves_from=path, scheduler=scheduler, slots=args.slots)
        print(
            f"{label:<20} {sim.iterations:>10} {sim.busy_s:>8.1f} {sim.wall_s:>8.1f} "
            f"{sim.best_metric:>10.4f}   ({time.perf_counter() - start:.1f} s to simulate)"
        )


if __name__ == "__main__":
    main()
