"""Commit-log growth: per-commit bytes and time proportional to what changed, storage linear in results.

Synchronous PBT, 4 members of a no-op trainable, every segment checkpointed and
every checkpoint kept (``num_to_keep=None``, the default: the trial table grows
by one checkpoint per member per round). The same run for ``--short`` and
``--long`` iterations, each in a fresh subprocess on local disk; the runner
counts every commit object the driver writes (its bytes and the time to
encode and publish it, ``common.CommitRecorder``).

Targets (issue "Durability at the edges" / "Fast from the first second"):
- commit bytes written, long / short run: about long/short (linear in the
  results), not its square;
- the largest commit written stays small (bounded by the snapshot rule);
- commit objects kept after the run are few (old ones are pruned).

    .venv/bin/python benchmarks/commit_log.py [--short 100] [--long 400]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import CommitRecorder, emit, python, run_json, scratch_dir, table, verdict, write_json

from popflow.tasks import Trainable


class Counter(Trainable):
    def setup(self, config: dict[str, Any]) -> None:
        self.count = 0

    def step(self) -> dict[str, Any]:
        self.count += self.config["c"]
        return {"score": self.count, "loss": 1.0 / (1 + self.count), "lr": self.config["c"]}

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {"count": self.count}

    def load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.count = checkpoint["count"]

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self.config = new_config
        return True


def runner(args: argparse.Namespace) -> None:
    from popflow import run
    from popflow.schedulers import PopulationBasedTraining

    with scratch_dir("popflow-bench-commits-") as storage, CommitRecorder() as commits:
        start = time.perf_counter()
        run(
            Counter,
            param_space={},
            scheduler=PopulationBasedTraining(
                time_attr="training_iteration",
                perturbation_interval=4,
                hyperparam_mutations={"c": [1, 2, 3]},
                synch=True,
            ),
            metric="score",
            mode="max",
            num_samples=4,
            stop={"training_iteration": args.iterations},
            storage=storage,
            name="growth",
            seed=0,
            n_workers=2,
        )
        wall = time.perf_counter() - start
        exp = os.path.join(storage, "growth")
        folder = os.path.join(exp, ".popflow", "commits")
        kept = [os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)]
        other = 0
        for root, _, files in os.walk(exp):
            if ".popflow" not in root:
                other += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    emit(
        {
            "iterations": args.iterations,
            "run_s": wall,
            "commits_written": len(commits.sizes),
            "commit_bytes_written": sum(commits.sizes),
            "largest_commit_bytes": max(commits.sizes),
            "mean_commit_ms": 1000 * sum(commits.seconds) / len(commits.seconds),
            "commits_kept": len(kept),
            "commit_bytes_kept": sum(kept),
            "other_bytes": other,
        }
    )


def main() -> None:
    # Prefect's temporary server, as before issue 14: nothing left running in the user's
    # PREFECT_HOME (the embedded default would start popflow's local server there)
    os.environ.setdefault("POPFLOW_PREFECT_SERVER", "temporary")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--short", type=int, default=100)
    parser.add_argument("--long", type=int, default=400)
    parser.add_argument("--runner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--iterations", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.runner:
        runner(args)
        return
    runs = {}
    for label, n in (("short", args.short), ("long", args.long)):
        cmd = [python(), __file__, "--runner", "--iterations", str(n)]
        runs[label] = run_json(cmd)
    short, long = runs["short"], runs["long"]
    growth = long["commit_bytes_written"] / short["commit_bytes_written"]
    scale = args.long / args.short
    rows = [
        [
            label,
            r["iterations"],
            r["commits_written"],
            r["commit_bytes_written"],
            r["largest_commit_bytes"],
            r["mean_commit_ms"],
            r["commits_kept"],
            r["commit_bytes_kept"],
            r["other_bytes"],
        ]
        for label, r in runs.items()
    ]
    headers = ["run", "iters", "commits", "written B", "largest B", "ms/commit", "kept", "kept B"]
    print(table([*headers, "other B"], rows))
    linear = growth <= 1.5 * scale
    print(
        f"commit bytes written, long/short: {growth:.2f} for {scale:.1f}x the results "
        f"(linear: ~{scale:.1f}) -> {verdict(linear)}"
    )
    path = write_json(
        "commit_log",
        {"runs": runs, "growth": growth, "scale": scale, "linear": linear},
    )
    print(f"figures: {path}")


if __name__ == "__main__":
    main()
