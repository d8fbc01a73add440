"""``popflow.simulate``: a scheduler run over learning curves in seconds, on a virtual clock.

The driver runs as in :func:`popflow.run`, but segments run in this process on the
simulated backend (:mod:`popflow.flows.backends.simulated`): no cluster, no Prefect
flow run, no sleeping. The curves come from a trainable (any of popflow's or Ray's
kinds; it reports what it would, and each result costs ``duration`` virtual seconds),
or from a finished experiment's ``result.json`` files (``curves_from``): each of its
trials is replayed, row by row, with the time each iteration took then, so
"what would ASHA have saved on last week's run?" is one call::

    sim = popflow.simulate(curves_from="./results/last_week", scheduler=ASHAScheduler(),
                           metric="loss", mode="min", slots=4)
    sim.iterations, sim.best_metric, sim.table   # vs. the run as it went

A simulation resumes as a run does (``resume=True`` or ``"auto"``, the same ``storage``
and ``name``): it opens the experiment from storage, takes its lease and goes on from the
last commit (:func:`drive_simulated`, which the fault simulator,
:mod:`popflow.flows.simulation`, drives too). The driver's helper work runs inline and
its lease is on the virtual clock, so a seeded simulation makes the same storage calls
in the same order every time.

Syne Tune simulates tabulated benchmarks (Salinas et al., 2022,
https://arxiv.org/abs/2201.05582); this replays your own experiments.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from popflow.flows.backends.simulated import Duration, SimulatedBackend, VirtualLease
from popflow.flows.driver.controller import Controller
from popflow.flows.events.callbacks import Callback
from popflow.flows.events.run_events import EventBus, Subscriber
from popflow.flows.experiment.opening import Experiment, open_experiment
from popflow.flows.experiment.results import ResultGrid, results_of
from popflow.flows.spec.config import CheckpointConfig
from popflow.flows.spec.groups import StorageSpec
from popflow.flows.spec.ray_configs import FailureConfig, RunConfig, TuneConfig
from popflow.flows.spec.run_spec import RunSpec, run_spec
from popflow.infra.helper_threads import inline_helpers
from popflow.infra.storage.folder import Storage
from popflow.schedulers import TrialScheduler, grid_search
from popflow.schedulers.search import Searcher
from popflow.tasks.progress import VOLATILE_FIELDS
from popflow.tasks.trainable import Trainable

#: Fields a replayed row does not report again: the segment fills them in itself.
FILLED = VOLATILE_FIELDS - {"time_this_iter_s"} | {
    "training_iteration",
    "done",
    "trial_id",
    "config",
    "experiment_tag",
}


@dataclass(frozen=True)
class Simulation:
    """What a simulated run did and cost.

    - ``grid``: its results (Ray's ``ResultGrid``);
    - ``iterations``: results the trials reported in all (the compute it spent);
    - ``busy_s``: virtual seconds the slots were busy; ``wall_s``: when its last
      segment ended on the virtual clock (with ``slots`` running at once);
    - ``table``: one row per trial: its config, the iterations it ran, its last and best
      metric; replayed curves add what the recorded run gave that trial.
    """

    grid: ResultGrid
    iterations: int
    busy_s: float
    wall_s: float
    table: pd.DataFrame = field(repr=False)
    metric: str | None = None
    mode: str | None = None

    @property
    def best_metric(self) -> float | None:
        """The best value of the metric any trial reported (by the run's mode)."""
        best = self.table["best"].dropna() if "best" in self.table else pd.Series([])
        if best.empty:
            return None
        return float(best.max() if self.mode == "max" else best.min())


class CurveReplay(Trainable):
    """Reports a recorded trial's rows, one per step (the curves: a class attribute set
    by :func:`simulate`; the trial: ``config["trial"]``)."""

    curves: Mapping[str, list[dict[str, Any]]] = {}

    def setup(self, config: dict[str, Any]) -> None:
        self.rows = self.curves[config["trial"]]
        self.at = 0

    def step(self) -> dict[str, Any]:
        row = {k: v for k, v in self.rows[self.at].items() if k not in FILLED}
        self.at += 1
        if self.at >= len(self.rows):
            row["done"] = True
        return row

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        Path(checkpoint_dir, "at.json").write_text(json.dumps(self.at))

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        self.at = json.loads(Path(checkpoint_dir, "at.json").read_text())


def recorded_curves(
    path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]], str | None, str | None]:
    """A finished experiment's trials: their rows (by trial folder), their configs, and
    the run's metric and mode."""
    grid = ResultGrid.from_path(path, storage_options)
    curves, configs = {}, {}
    for result in grid:
        rows = list(result.history)
        if rows:
            name = os.path.basename(result.path.rstrip("/"))
            curves[name], configs[name] = rows, dict(result.config)
    if not curves:
        raise ValueError(f"`curves_from` is {str(path)!r}, but none of its trials has a result")
    return curves, configs, grid._metric, grid._mode


def simulate(
    trainable: type[Trainable] | Callable[[dict[str, Any]], Any] | None = None,
    param_space: dict[str, Any] | None = None,
    *,
    curves_from: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    scheduler: TrialScheduler | None = None,
    search_alg: Searcher | None = None,
    metric: str | None = None,
    mode: str | None = None,
    num_samples: int = 1,
    stop: Mapping[str, Any] | Callable[[str, dict[str, Any]], bool] | None = None,
    checkpoint_config: CheckpointConfig | None = None,
    max_failures: int = 0,
    slots: int = 1,
    duration: Duration | None = None,
    commit_interval: float = 60.0,
    storage: str | os.PathLike[str] | Storage | None = None,
    name: str = "simulation",
    seed: int = 0,
    callbacks: Sequence[Callback] | None = None,
    subscribers: Sequence[Subscriber] = (),
    resume: bool | str = False,
    lease_ttl: float = 60.0,
) -> Simulation:
    """Run ``scheduler`` over ``trainable`` (or the curves of the finished experiment at
    ``curves_from``) on ``slots`` simulated slots; what it did and cost.

    ``duration``: virtual seconds per result: a number, a result key (the time the
    trainable reports), or a function of the result. Default: 1 per result for a
    trainable, the recorded ``time_this_iter_s`` for replayed curves. ``commit_interval``
    is virtual seconds too. Results go to ``storage`` (default: a new temporary folder,
    kept so the grid can read its trials' histories). ``callbacks``: Ray's ``tune.Callback``s,
    called as in a real run. ``subscribers`` follow the driver's
    events (:mod:`popflow.flows.events.run_events`). ``resume``: continue the experiment
    ``name`` in ``storage`` from its last commit (True; "auto": if there is one), as
    :func:`popflow.run` does; ``lease_ttl`` is in virtual seconds. The other arguments are
    :func:`popflow.run`'s.
    """
    table_extra: dict[str, dict[str, Any]] = {}
    if curves_from is not None:
        if trainable is not None or param_space is not None or search_alg is not None:
            raise ValueError(
                "`curves_from` replays a finished experiment's trials: give it without a "
                "`trainable`, `param_space` or `search_alg`"
            )
        curves, configs, recorded_metric, recorded_mode = recorded_curves(
            curves_from, storage_options
        )
        metric, mode = metric or recorded_metric, mode or recorded_mode
        trainable = type("CurveReplay", (CurveReplay,), {"curves": curves})
        param_space = {"trial": grid_search(sorted(curves))}
        duration = "time_this_iter_s" if duration is None else duration
        table_extra = {
            name: {
                "config": configs[name],
                "recorded_iterations": len(rows),
                **_best_and_last(rows, metric, mode, "recorded"),
            }
            for name, rows in curves.items()
        }
    elif trainable is None:
        raise ValueError("give a `trainable` (and `param_space`), or `curves_from`")
    spec = run_spec(
        trainable,
        param_space,
        TuneConfig(
            metric=metric,
            mode=mode,
            scheduler=scheduler,
            search_alg=search_alg,
            num_samples=num_samples,
            seed=seed,
        ),
        RunConfig(
            name=name,
            failure_config=FailureConfig(max_failures=max_failures),
            checkpoint_config=checkpoint_config,
            verbose=0,
            stop=stop,
            callbacks=list(callbacks) if callbacks is not None else None,
        ),
        StorageSpec(
            storage
            if isinstance(storage, Storage)
            else Storage(storage or tempfile.mkdtemp(prefix="popflow-simulation-")),
            commit_interval=commit_interval,
            lease_ttl=lease_ttl,
        ),
    )
    backend = SimulatedBackend(slots, 1.0 if duration is None else duration)
    experiment = drive_simulated(spec, backend, resume, events=EventBus(*subscribers))
    grid = results_of(experiment.records, experiment.storage, spec.metric, spec.mode)
    rows = []
    for result in grid:
        history = list(result.history)
        trial = result.config.get("trial") if curves_from is not None else None
        row = {
            "trial_id": result.trial_id,
            "config": result.config if trial is None else table_extra[trial]["config"],
            "iterations": len(history),
            **_best_and_last(history, spec.metric, spec.mode, ""),
            "status": result.status,
        }
        if trial is not None:
            row.update({k: v for k, v in table_extra[trial].items() if k != "config"})
        rows.append(row)
    return Simulation(
        grid=grid,
        iterations=backend.results,
        busy_s=backend.busy_s,
        wall_s=backend.clock.monotonic(),
        table=pd.DataFrame(rows),
        metric=spec.metric,
        mode=spec.mode,
    )


def drive_simulated(
    spec: RunSpec,
    backend: SimulatedBackend,
    resume: bool | str = False,
    *,
    force_takeover: bool = False,
    events: EventBus | None = None,
) -> Experiment:
    """Start (``resume=False``) or continue (True, "auto") the experiment ``spec`` names on
    the simulated ``backend``, as :func:`popflow.run` does on a cluster: open it from
    storage under its lease (a :class:`~popflow.flows.backends.simulated.VirtualLease` on
    the backend's clock; ``force_takeover``: ``popflow resume --force-takeover``), go on
    from its last commit, and run its rounds to the end. The experiment as it ended (an
    experiment that had finished already is returned as it was; nothing runs).

    Helper work (derived-log writes, checkpoint transfers and deletions) runs inline in
    this thread (:mod:`popflow.infra.helper_threads`): one driver's storage calls come in
    one order, the same on every run.
    """

    def lease(storage: Storage, ttl: float) -> VirtualLease:
        return VirtualLease(storage, ttl, backend.clock, force=force_takeover)

    with inline_helpers(), open_experiment(spec, resume, make_lease=lease) as experiment:
        if not experiment.finished:
            controller = Controller(spec, experiment, backend, events or EventBus())
            controller.drive(fresh=experiment.resumed_from is None)
    return experiment


def _best_and_last(
    rows: list[dict[str, Any]], metric: str | None, mode: str | None, prefix: str
) -> dict[str, Any]:
    """The last and best value of ``metric`` over ``rows`` (keys ``<prefix>_last``...)."""
    key = f"{prefix}_" if prefix else ""
    values = [
        float(r[metric])
        for r in rows
        if metric and isinstance(r.get(metric), int | float) and math.isfinite(r[metric])
    ]
    best = (max if mode == "max" else min)(values) if values else None
    return {f"{key}last": values[-1] if values else None, f"{key}best": best}
