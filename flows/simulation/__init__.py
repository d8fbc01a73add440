"""Deterministic simulation of the driver, its storage and its lease, under a seed.

The whole of a run, driver, storage and lease, runs in one process on a virtual clock
(the simulated backend, :func:`~popflow.flows.api.simulate.drive_simulated`), over a
storage that, at chosen storage calls, fails, delays, crashes the driver, tears an
append, stalls the driver while another takes the experiment over, or plants a forged
lease or a damaged checkpoint (:mod:`~popflow.flows.simulation.faults`). Only one
driver thread runs at a time and the baton passes only at storage calls
(:mod:`~popflow.flows.simulation.world`), so a seed's schedule replays exactly. After
each schedule the invariants are checked (:mod:`~popflow.flows.simulation.invariants`);
a failing schedule shrinks to a one-line repro (:mod:`~popflow.flows.simulation.explore`).
FoundationDB's simulator and TigerBeetle's VOPR work so.

    >>> from popflow.flows.simulation import Schedule, run_schedule
    >>> run_schedule(Schedule.parse("pbt/2x3/s1:20=crash")).problems
    []
"""

from popflow.flows.simulation.explore import (
    Exploration,
    Ran,
    explore,
    random_schedule,
    run_schedule,
    shrink,
)
from popflow.flows.simulation.faults import Fault, Scenario, Schedule, SimulatedCrash

__all__ = [
    "Exploration",
    "Fault",
    "Ran",
    "Scenario",
    "Schedule",
    "SimulatedCrash",
    "explore",
    "random_schedule",
    "run_schedule",
    "shrink",
]
