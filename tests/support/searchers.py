"""Searchers through the real driver on the simulated backend, and the property a
resume rests on: replaying a run's committed calls onto a fresh searcher gives back every
suggestion it made (:mod:`popflow.flows.driver.suggestions`)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from trainables import Drifting

import popflow
from popflow import uniform
from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import ExperimentLog
from popflow.schedulers.search import Searcher
from popflow.tasks.seeding import searcher_seed

SPACE = {"lr": uniform(0.0, 1.0)}

#: what :func:`simulate` runs unless told otherwise
DEFAULTS: dict[str, Any] = {
    "metric": "score",
    "mode": "max",
    "num_samples": 6,
    "slots": 2,
    "stop": {"training_iteration": 4},
    "seed": 3,
}


def simulate(tmp_path: Path, search_alg: Searcher | None, **kwargs: Any) -> popflow.Simulation:
    """``Drifting`` over ``SPACE`` (or ``param_space``), suggested by ``search_alg``."""
    space = kwargs.pop("param_space", SPACE)
    args = {**DEFAULTS, "storage": str(tmp_path), **kwargs}
    return popflow.simulate(Drifting, space, search_alg=search_alg, **args)


def configs(sim: popflow.Simulation) -> list[dict[str, Any]]:
    return [r.config for r in sorted(sim.grid, key=lambda r: r.trial_id)]


def committed(tmp_path: Path) -> dict[str, Any]:
    """The last commit's state of the run simulated into ``tmp_path``."""
    return ExperimentLog(Storage(str(tmp_path / "simulation"))).latest()


def replayed_suggestions(
    searcher: Searcher, tmp_path: Path, **kwargs: Any
) -> tuple[list[Any], list[Any]]:
    """Simulate a run with ``searcher``, then replay its committed calls onto a fresh copy
    (told what the driver tells it), as a resume does: (committed suggestions, replayed
    ones). A resumed run continues as an uninterrupted one where the two are equal."""
    fresh = copy.deepcopy(searcher)
    simulate(tmp_path, searcher, **kwargs)
    calls = committed(tmp_path)["search_calls"]
    space = kwargs.get("param_space", SPACE)
    fresh.set_search_properties(
        kwargs.get("metric", DEFAULTS["metric"]),
        kwargs.get("mode", DEFAULTS["mode"]),
        dict(space),
        num_samples=kwargs.get("num_samples", DEFAULTS["num_samples"]),
        seed=searcher_seed(kwargs.get("seed", DEFAULTS["seed"])),
    )
    made, again = [], []
    for call in calls:
        if call[0] == "s":
            made.append(_canonical(call[2]))
            again.append(_canonical(fresh.suggest(call[1])))
        elif call[0] == "r":
            fresh.on_trial_result(call[1], call[2])
        elif call[0] == "c":
            fresh.on_trial_complete(call[1], result=call[2], error=call[3])
        elif call[0] == "p":
            fresh.on_pause(call[1])
        elif call[0] == "u":
            fresh.on_unpause(call[1])
    return made, again


def _canonical(config: Any) -> Any:
    return json.loads(json.dumps(config, sort_keys=True)) if isinstance(config, dict) else config
