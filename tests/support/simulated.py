"""Scheduler tests on the real driver: :func:`popflow.simulate` on the simulated backend,
with what a test inspects gathered from the driver's events.

This replaces the fakes that played the controller in test_pbt, test_hyperband and
test_pb2: the round loop under test is the one :func:`popflow.run` uses.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainables import trial_index

import popflow
from popflow.flows.api.simulate import Simulation
from popflow.flows.events.run_events import (
    Decided,
    Event,
    Exploited,
    TrialErrored,
    TrialResult,
    TrialStarted,
)
from popflow.schedulers import Decision, Exploit, Trial, TrialScheduler
from popflow.schedulers.search_space import grid_search, sample_from

#: where runs without a ``storage`` write: memory, where there is a tmpfs (runs write a
#: checkpoint per segment; on a busy disk that is most of their time)
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def space_of(configs: list[dict[str, Any]]) -> dict[str, Any]:
    """A param space whose trial ``i`` has ``configs[i]`` (and ``variant: i``)."""
    keys = {key for config in configs for key in config}
    return {"variant": grid_search(list(range(len(configs))))} | {
        key: sample_from(lambda spec, key=key: configs[spec["variant"]][key])
        for key in sorted(keys)
    }


@dataclass
class SimulatedRun:
    """What a simulated run did, each trial named ``label.format(index)`` (``t0``, ...).

    ``results``: (trial, result) as the driver recorded them; ``decisions``: (trial,
    result, decision) for each result the scheduler decided on; ``exploits``: the
    exploits the driver carried out (target, source); ``errored``: trials that errored.
    """

    sim: Simulation
    scheduler: TrialScheduler
    trials: dict[str, Trial] = field(default_factory=dict)
    results: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    decisions: list[tuple[str, dict[str, Any], Decision]] = field(default_factory=list)
    exploits: list[tuple[str, str]] = field(default_factory=list)
    errored: list[str] = field(default_factory=list)

    @property
    def final(self) -> dict[str, Any]:
        """Each trial's last value of the run's metric."""
        metric = self.sim.metric
        return {name: result[metric] for name, result in self.results if metric in result}

    @property
    def decided(self) -> list[Decision]:
        return [decision for _, _, decision in self.decisions]

    @property
    def decided_exploits(self) -> list[Exploit]:
        """Every exploit the scheduler decided, in order."""
        return [ex for d in self.decided for ex in d.exploits]


def simulated(
    trainable: Any,
    param_space: dict[str, Any],
    scheduler: TrialScheduler,
    *,
    label: str = "t{}",
    swap_after: int | None = None,
    fresh: Callable[[], TrialScheduler] | None = None,
    **kwargs: Any,
) -> SimulatedRun:
    """``popflow.simulate(trainable, param_space, scheduler=scheduler, **kwargs)``, followed.

    ``swap_after`` results (with ``fresh`` making a new scheduler): the scheduler is
    replaced, mid-run, by a fresh one restored from a JSON round trip of its state, as a
    resumed driver restores it (``set_state``, then nothing else).

    Without a ``storage``, the run's folder is removed when it ends (``sim.grid`` cannot
    read histories then; the events gathered here hold the results).
    """
    kwargs.setdefault("slots", 1)
    run = SimulatedRun(sim=None, scheduler=scheduler)  # type: ignore[arg-type]
    names: dict[str, str] = {}
    count = 0

    def name(trial_id: str) -> str:
        return names.setdefault(trial_id, label.format(trial_index(trial_id)))

    def swap() -> None:
        assert fresh is not None, "`swap_after` needs `fresh`"
        restored = fresh()
        restored.set_state(json.loads(json.dumps(scheduler.get_state())))
        # the driver holds this object (and its trial table, and bound methods of it): it
        # takes on the restored scheduler's whole state, as if the driver had been handed it
        scheduler.__dict__ = restored.__dict__

    def follow(event: Event) -> None:
        nonlocal count
        if isinstance(event, TrialStarted):
            run.trials.setdefault(name(event.record.trial_id), event.record.trial)
        elif isinstance(event, TrialResult):
            if count == swap_after:  # the previous result was the swap_after-th
                swap()
            count += 1
            run.results.append((name(event.record.trial_id), dict(event.result)))
        elif isinstance(event, Decided):
            run.decisions.append((name(event.trial_id), event.result, event.decision))
        elif isinstance(event, Exploited):
            run.exploits.append((name(event.target), name(event.source)))
        elif isinstance(event, TrialErrored):
            run.errored.append(name(event.record.trial_id))

    if "storage" in kwargs:
        run.sim = popflow.simulate(
            trainable, param_space, scheduler=scheduler, subscribers=[follow], **kwargs
        )
    else:  # what a test reads came by events: the folder goes with the run
        with tempfile.TemporaryDirectory(prefix="popflow-test-", dir=SCRATCH) as storage:
            run.sim = popflow.simulate(
                trainable,
                param_space,
                scheduler=scheduler,
                subscribers=[follow],
                storage=storage,
                **kwargs,
            )
    run.trials = dict(sorted(run.trials.items(), key=lambda kv: trial_index(kv[1].trial_id)))
    return run
