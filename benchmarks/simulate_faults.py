"""Deterministic fault simulation: ``--schedules N`` seeded schedules, their rate, and
each failing seed with its shrunk one-line repro (``--replay`` runs one again).

    python benchmarks/simulate_faults.py --schedules 1000 --seed 0
    python benchmarks/simulate_faults.py --replay "pbt/2x4/s2:22=crash"

See docs/explanation/fencing-and-commits.md ("Finding the next interleaving").
"""

from __future__ import annotations

import argparse
import logging

from popflow.flows.simulation import Schedule, explore, run_schedule


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0, help="the first schedule's seed")
    parser.add_argument("--replay", help="one schedule, as a failure printed it")
    parser.add_argument("--no-shrink", action="store_true", help="report failures as found")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # crashed drivers log what they would have
    if args.replay:
        ran = run_schedule(Schedule.parse(args.replay))
        print(f"{ran.schedule}: drivers {ran.drivers}; {ran.calls} calls")
        for problem in ran.problems or ["no invariant broken"]:
            print(f"  {problem}")
        return
    found = explore(args.schedules, args.seed, shrink_failures=not args.no_shrink)
    print(
        f"{found.schedules} schedules in {found.seconds:.1f} s: "
        f"{found.per_second:.1f} schedules/s; {len(found.failures)} failed"
    )
    for seed, ran in found.failures:
        print(f"seed {seed}: {', '.join(sorted(ran.broke))}")
        print(f'  repro: python benchmarks/simulate_faults.py --replay "{ran.schedule}"')
        print(f"  {ran.problems[0][:300]}")


if __name__ == "__main__":
    main()
