"""Schedules from seeds, run and checked; a failing one shrunk to a short repro.

- :func:`random_schedule`: a seed's schedule (a pure function of the seed): a scenario and
  1-3 faults at call indices within an undisturbed run's calls;
- :func:`run_schedule`: one schedule in a fresh folder, its invariants checked
  (:mod:`popflow.flows.simulation.invariants`); the undisturbed run it is compared with
  is run once per scenario and kept;
- :func:`shrink`: drops faults (halves, then one at a time) while the schedule still
  breaks the same invariant;
- :func:`explore`: ``n`` seeds in a row; what failed, shrunk.

A schedule replays exactly: ``run_schedule(Schedule.parse("pbt/3x4/s2:17=crash"))``, or
``python benchmarks/simulate_faults.py --replay "pbt/3x4/s2:17=crash"``.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from popflow.flows.experiment.trial_table import is_finished
from popflow.flows.simulation.faults import Fault, Scenario, Schedule
from popflow.flows.simulation.invariants import kept, outcome, violations
from popflow.flows.simulation.scenarios import LEASE_TTL, NAME, spec_for
from popflow.flows.simulation.world import Driver, World
from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import ExperimentLog

#: Where schedules write: memory, where there is a tmpfs
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
#: How often each fault is drawn (the rest of the space: planted files)
WEIGHTS: dict[Fault, float] = {
    Fault.CRASH: 6,
    Fault.CRASH_AFTER: 3,
    Fault.TORN: 2,
    Fault.FAIL: 3,
    Fault.DELAY: 1,
    Fault.STALL: 3,
    Fault.STALL_FORCE: 1,
    Fault.FORGE_LEASE: 1,
    Fault.GARBLE_LEASE: 1,
    Fault.DAMAGE_CHECKPOINT: 2,
}
#: The share of drawn stalls that stop inside their call (Fault.STALL_INSIDE)
STALL_INSIDE_SHARE = 0.5
#: The share of schedules that also stall one segment call on its worker
#: (Fault.STALL_SEGMENT), at a call of their own
STALL_SEGMENT_SHARE = 0.25
#: What sits beside the experiment: it must be left as it is
BESIDE = ("other", "victim.txt")
BESIDE_TEXT = "nobody writes here\n"


@dataclass
class Ran:
    """One schedule's run: the invariants it broke (none: it passed), and what it did."""

    schedule: Schedule
    problems: list[str]
    calls: int
    drivers: list[str]
    fired: list[tuple[int, Fault]]

    @property
    def failed(self) -> bool:
        return bool(self.problems)

    @property
    def broke(self) -> set[str]:
        """The invariants broken (``exactly once``, ``identical``, ...)."""
        return {p.split(":", 1)[0] for p in self.problems}


@dataclass
class Undisturbed:
    seen: dict[str, Any]
    calls: int


_references: dict[Scenario, Undisturbed] = {}


def undisturbed(scenario: Scenario) -> Undisturbed:
    """``scenario`` run with no fault (once per process)."""
    if scenario not in _references:
        ran, seen = _run(Schedule(scenario), None)
        if ran.problems:
            raise RuntimeError(f"{scenario} fails undisturbed: {ran.problems}")
        _references[scenario] = Undisturbed(seen, ran.calls)
    return _references[scenario]


def run_schedule(schedule: Schedule) -> Ran:
    """Run ``schedule`` in a fresh folder (removed after) and check the invariants."""
    reference = undisturbed(schedule.scenario)
    ran, _ = _run(schedule, reference.seen if schedule.scenario.synchronous else None)
    return ran


def _run(schedule: Schedule, reference: dict[str, Any] | None) -> tuple[Ran, dict[str, Any]]:
    folder = tempfile.mkdtemp(prefix="popflow-faults-", dir=SCRATCH)
    try:
        root = Storage(os.path.join(folder, "store"))
        root.write_text(BESIDE_TEXT, *BESIDE)
        scenario = schedule.scenario
        world = World(schedule, root, lambda storage: spec_for(scenario, storage), NAME, LEASE_TTL)
        experiment = world.experiment

        def finished() -> bool:
            latest = ExperimentLog(experiment).latest()
            return latest is not None and is_finished(latest)

        def look(ended: Driver) -> list[str]:
            return _as_a_reader_sees(experiment, ended)

        world.look = look
        world.run(finished)
        problems = list(world.problems)
        try:
            seen = outcome(experiment)
        except Exception as e:  # a folder no reader can read is a finding too
            seen = {"finished": False, "trials": {}, "policy": []}
            problems.append(f"readable: {type(e).__name__}: {e}")
        problems += violations(seen, world.commits, reference)
        if seen["finished"] and not any(f is Fault.DAMAGE_CHECKPOINT for _, f in schedule.faults):
            problems += kept(experiment)  # (a damaged checkpoint never restored from stays so)
        problems += [f"inside: {w}" for w in world.outside]
        if root.read_text(*BESIDE) != BESIDE_TEXT:
            problems.append(f"inside: {'/'.join(BESIDE)} beside the experiment was changed")
        drivers = [
            f"{d.number}:{d.outcome}" + (f"({type(d.error).__name__})" if d.error else "")
            for d in world.drivers
        ]
        return Ran(schedule, _unique(problems), world.calls, drivers, list(world.fired)), seen
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _as_a_reader_sees(experiment: Storage, ended: Driver) -> list[str]:
    """The invariants a reader of the finished ``experiment`` finds broken right after
    ``ended`` stopped (each line says when)."""
    when = f"when driver {ended.number} stopped ({ended.outcome}), "
    try:
        seen = outcome(experiment)
    except Exception as e:  # a folder no reader can read is a finding too
        return [f"readable: {when}{type(e).__name__}: {e}"]
    found = []
    for problem in violations(seen, [], None):
        invariant, _, what = problem.partition(": ")
        if invariant != "ends":
            found.append(f"{invariant}: {when}{what}")
    return found


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def random_schedule(
    seed: int,
    kinds: tuple[str, ...] = Scenario.KINDS,
    weights: dict[Fault, float] | None = None,
) -> Schedule:
    """The schedule of ``seed``: a scenario of ``kinds`` and 1-3 faults drawn by
    ``weights`` (default :data:`WEIGHTS`) at calls an undisturbed run makes; of the
    stalls, :data:`STALL_INSIDE_SHARE` stop inside their call; :data:`STALL_SEGMENT_SHARE`
    of the schedules also stall a segment call on its worker."""
    rng = random.Random(seed)
    scenario = Scenario(rng.choice(kinds), rng.randint(2, 4), rng.randint(3, 5), rng.randint(1, 2))
    calls = undisturbed(scenario).calls
    table = weights or WEIGHTS
    faults = list(table)
    chosen: dict[int, Fault] = {}
    for _ in range(rng.choice((1, 1, 2, 2, 3))):
        chosen[rng.randrange(calls)] = rng.choices(faults, [table[f] for f in faults])[0]
    # Half the stalls stop inside their call (past its checks, before its bytes): drawn
    # from a stream of their own, so every seed keeps the scenario and faults it had
    inside = random.Random(f"stall_inside/{seed}")
    for index in sorted(chosen):
        if chosen[index] is Fault.STALL and inside.random() < STALL_INSIDE_SHARE:
            chosen[index] = Fault.STALL_INSIDE
    # A stalled segment call, added to a share of the schedules from a stream of its own:
    # every seed keeps what it drew before, and some stall a segment besides
    segment = random.Random(f"stall_segment/{seed}")
    if segment.random() < STALL_SEGMENT_SHARE:
        chosen.setdefault(segment.randrange(calls), Fault.STALL_SEGMENT)
    return Schedule(scenario, tuple(sorted(chosen.items(), key=lambda p: p[0])))


def shrink(ran: Ran, run: Callable[[Schedule], Ran] = run_schedule) -> Ran:
    """The shortest schedule found that breaks an invariant ``ran`` broke: halves of its
    faults first, then each fault dropped in turn, while it still fails so."""
    broke = ran.broke
    best = ran

    def tries(faults: list[tuple[int, Fault]]) -> Ran | None:
        candidate = run(dataclasses.replace(best.schedule, faults=tuple(faults)))
        return candidate if candidate.broke & broke else None

    changed = True
    while changed and best.schedule.faults:
        changed = False
        faults = list(best.schedule.faults)
        if len(faults) > 1:
            half = len(faults) // 2
            for part in (faults[:half], faults[half:]):
                if (found := tries(part)) is not None:
                    best, changed = found, True
                    break
        if changed:
            continue
        for i in range(len(faults)):
            if (found := tries(faults[:i] + faults[i + 1 :])) is not None:
                best, changed = found, True
                break
    return best


@dataclass
class Exploration:
    """What :func:`explore` ran: schedules, seconds, and each failing seed with its
    schedule shrunk."""

    schedules: int = 0
    seconds: float = 0.0
    failures: list[tuple[int, Ran]] = field(default_factory=list)

    @property
    def per_second(self) -> float:
        return self.schedules / self.seconds if self.seconds else 0.0


def explore(
    schedules: int,
    seed: int = 0,
    *,
    kinds: tuple[str, ...] = Scenario.KINDS,
    weights: dict[Fault, float] | None = None,
    shrink_failures: bool = True,
    stop_after: int | None = None,
    until: Callable[[Ran], bool] | None = None,
) -> Exploration:
    """Run the schedules of seeds ``seed .. seed + schedules - 1``; ``stop_after``: stop
    once that many failed; ``until``: stop at the first failure it accepts."""
    found = Exploration()
    start = time.perf_counter()
    for s in range(seed, seed + schedules):
        ran = run_schedule(random_schedule(s, kinds, weights))
        found.schedules += 1
        if ran.failed and (until is None or until(ran)):
            found.failures.append((s, shrink(ran) if shrink_failures else ran))
            if until is not None or (stop_after is not None and len(found.failures) >= stop_after):
                break
    found.seconds = time.perf_counter() - start
    return found
