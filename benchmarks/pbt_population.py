"""A large synchronous PBT population: per-round orchestration of 256 no-op members (issue 14).

``PopulationBasedTraining(synch=True, perturbation_interval=1)`` over ``--members``
members of ``pbt_overhead.NoopTrainable`` (a counter kept in a dict checkpoint), on a
pre-started cluster of 2 process workers. Every round each member trains one no-op
step, saves its checkpoint, the population is ranked and a quarter exploits another;
so a round's wall is all orchestration: planning, runner calls, checkpoint saves and
restores, the scheduler, the commit.

Per round = (wall of N rounds - wall of 1 round) / (N - 1), each a ``run()`` on the
pre-started cluster (start-up and the run's set-up cancel out); also from the commit log:
(last commit - first round's commit) / (N - 1). ``--ray``: Ray Tune's figure for the same
population (``ray_side.py pbt-noop --members``). Target: <= 0.5 s per round.

    .venv/bin/python benchmarks/pbt_population.py                 # 256 members, 6 rounds
    .venv/bin/python benchmarks/pbt_population.py --ray
    .venv/bin/python benchmarks/pbt_population.py --quick         # 32 members, 3 rounds
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from common import (
    BENCHMARKS,
    RESULTS_DIR,
    CommitRecorder,
    PrefectServer,
    emit,
    python,
    run_json,
    scratch_dir,
    table,
    verdict,
    write_json,
)

ROUND_TARGET_S = 0.5
WORKERS = 2


def _run(members: int, rounds: int, storage: str, name: str, client: Any) -> float:
    from pbt_overhead import NoopTrainable

    from popflow import run
    from popflow.schedulers import PopulationBasedTraining

    start = time.perf_counter()
    run(
        NoopTrainable,
        param_space={},
        scheduler=PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=1,
            hyperparam_mutations={"c": [1, 2]},
            synch=True,
        ),
        metric="score",
        mode="max",
        num_samples=members,
        stop={"training_iteration": rounds},
        storage=storage,
        name=name,
        seed=0,
        dask_address=client,
        verbose=0,
    )
    return time.perf_counter() - start


def runner(args: argparse.Namespace) -> None:
    from popflow.infra.cluster.dask_cluster import dask_client

    figures: dict[str, Any] = {"members": args.members, "rounds": args.rounds}
    with scratch_dir("popflow-bench-population-") as storage, dask_client(None, WORKERS) as client:
        _run(min(args.members, 16), 2, storage, "warmup", client)
        ones, ns, between = [], [], []
        for rep in range(args.repeats):
            ones.append(_run(args.members, 1, storage, f"one_{rep}", client))
            with CommitRecorder() as commits:
                ns.append(_run(args.members, args.rounds, storage, f"n_{rep}", client))
            # commit 0 is the sampled population, commit 1 the first round
            between.append((commits.times[-1] - commits.times[1]) / (args.rounds - 1))
            figures.setdefault("commit_seconds", []).append(commits.seconds)
    wall_1, wall_n = statistics.median(ones), statistics.median(ns)
    figures.update(
        walls_1_round_s=ones,
        walls_n_rounds_s=ns,
        per_round_s=(wall_n - wall_1) / (args.rounds - 1),
        per_round_from_commits_s=statistics.median(between),
    )
    emit(figures)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="32 members, 3 rounds")
    parser.add_argument("--members", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3, help="run() calls per figure")
    parser.add_argument("--ray", action="store_true", help="Ray Tune's figure too")
    parser.add_argument("--runner", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.members, args.rounds, args.repeats = 32, 3, 1
    if args.runner:
        runner(args)
        return

    me = [python(), str(Path(__file__).resolve()), "--runner", "--members", str(args.members),
          "--rounds", str(args.rounds), "--repeats", str(args.repeats)]  # fmt: skip
    logs = RESULTS_DIR / "logs"
    print(f"synch PBT, {args.members} no-op members, {args.rounds} rounds, {WORKERS} workers")
    with PrefectServer() as server:
        print(f"prefect server on {server.url}, started in {server.startup_s:.2f} s", flush=True)
        pop = run_json(me, env=server.client_env(), log_path=logs / "pbt_population.log")
    rows = [["popflow", pop["walls_1_round_s"][0], pop["walls_n_rounds_s"][0],
             pop["per_round_s"], pop["per_round_from_commits_s"]]]  # fmt: skip
    ray = None
    if args.ray:
        ray = run_json(
            [python(), str(BENCHMARKS / "ray_side.py"), "pbt-noop", "--synch",
             "--members", str(args.members), "--iterations", str(args.rounds)],
            log_path=logs / "pbt_population_ray.log",
        )  # fmt: skip
        rows.append(["ray", ray["wall_1_s"], ray["wall_n_s"], ray["per_round_s"], "-"])
    headers = ["system", "1-round wall s", f"{args.rounds}-round wall s", "s/round",
               "s/round (commits)"]  # fmt: skip
    print(table(headers, rows))
    met = pop["per_round_s"] <= ROUND_TARGET_S
    print(
        f"per-round orchestration {pop['per_round_s']:.3f} s (commits: "
        f"{pop['per_round_from_commits_s']:.3f} s; target <= {ROUND_TARGET_S}: {verdict(met)})"
        + (f"; Ray {ray['per_round_s']:.3f} s" if ray else "")
    )
    path = write_json(
        "pbt_population",
        {"popflow": pop, "ray": ray, "target_s": ROUND_TARGET_S, "target_met": met,
         "quick": args.quick, "members": args.members},
    )  # fmt: skip
    print(f"figures written to {path}")


if __name__ == "__main__":
    sys.exit(main())
