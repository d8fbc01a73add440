"""What a Dask worker runs: one trial's segment, from a checkpoint up to a decision point.

A segment builds the trainable, restores it from storage, trains until the
scheduler's milestone (or a stop condition), saves checkpoints to storage and
returns the results. It never talks to the Prefect API and keeps no state
between segments, so any worker can run any segment and a lost worker costs
only the segment it was running.
"""

from __future__ import annotations

import inspect
import logging
import os
import pickle
import tempfile
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from infra.checkpoint_store import fetch_checkpoint, publish_checkpoint
from infra.jsonutil import jsonable
from infra.storage import Storage
from tasks.checkpoint import DICT_CHECKPOINT_FILE, Checkpoint
from tasks.function_api import run_in_session
from tasks.progress import ProgressClock
from tasks.seeding import isolate_dask_sampling, seed_globals
from tasks.trainable import Trainable

logger = logging.getLogger(__name__)
isolate_dask_sampling()  # runs on every worker that imports this module

StopCondition = Mapping[str, Any] | Callable[[str, dict[str, Any]], bool] | None


@dataclass(frozen=True)
class SegmentSpec:
    """Everything a worker needs to run one segment (picklable)."""

    trainable: type[Trainable] | Callable[[dict[str, Any]], Any]
    trial_id: str
    trial_dir: str  # relative to ``storage``
    config: dict[str, Any]
    storage: Storage
    seed: int
    restore: str | None = None  # checkpoint folder relative to ``storage``
    time_attr: str | None = None
    target: float | None = None  # end the segment once result[time_attr] >= target
    max_iterations: int | None = None  # end the segment after this many iterations
    stop: StopCondition = None
    checkpoint_frequency: int = 0
    checkpoint_at_end: bool = True
    taken: frozenset[str] = frozenset()  # checkpoint names this trial already has


@dataclass
class CheckpointRecord:
    name: str  # folder name under the trial folder
    iteration: int
    result: dict[str, Any]


@dataclass
class SegmentOutcome:
    trial_id: str
    results: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[CheckpointRecord] = field(default_factory=list)
    #: why it ended: "milestone", "max_iterations", "done", "stop", "finished" or "error"
    reason: str = "error"
    error: str | None = None


def is_function_trainable(trainable: object) -> bool:
    return not (inspect.isclass(trainable) and issubclass(trainable, Trainable))


def should_stop(stop: StopCondition, trial_id: str, result: dict[str, Any]) -> bool:
    """Ray's stop semantics: a dict stops when any ``result[key] >= value``."""
    if stop is None:
        return False
    if callable(stop):
        return bool(stop(trial_id, result))
    for key, bound in stop.items():
        if key not in result:
            raise ValueError(
                f"stop condition key {key!r} is not in the trial's result; "
                f"result keys are {sorted(result)}"
            )
        if result[key] >= bound:
            return True
    return False


def checkpoint_name(iteration: int, taken: frozenset[str] | set[str]) -> str:
    """``checkpoint_000010``; a suffix when a restarted lineage reaches a used iteration."""
    name = f"checkpoint_{iteration:06d}"
    k = 1
    while name in taken:
        name = f"checkpoint_{iteration:06d}_{k}"
        k += 1
    return name


class _SegmentRun:
    """State of one running segment; shared by the class and function APIs."""

    def __init__(self, spec: SegmentSpec, clock: ProgressClock):
        self.spec = spec
        self.clock = clock
        self.outcome = SegmentOutcome(trial_id=spec.trial_id)
        self._taken = set(spec.taken)
        self._start_iteration = clock.iteration

    def end_reason(self, result: dict[str, Any]) -> str | None:
        spec = self.spec
        if result.get("done"):
            return "done"
        if should_stop(spec.stop, spec.trial_id, result):
            return "stop"
        if (
            spec.target is not None
            and spec.time_attr in result
            and result[spec.time_attr] >= spec.target
        ):
            return "milestone"
        if (
            spec.max_iterations is not None
            and self.clock.iteration - self._start_iteration >= spec.max_iterations
        ):
            return "max_iterations"
        return None

    def wants_checkpoint(self, reason: str | None) -> bool:
        freq = self.spec.checkpoint_frequency
        if freq and self.clock.iteration % freq == 0:
            return True
        if reason in ("milestone", "max_iterations"):
            return True  # the trial continues later from here
        return reason in ("done", "stop") and self.spec.checkpoint_at_end

    def publish(self, local_dir: str, result: dict[str, Any]) -> None:
        name = checkpoint_name(self.clock.iteration, self._taken)
        self._taken.add(name)
        metadata = {**self.clock.metadata(), "result": jsonable(result)}
        publish_checkpoint(self.spec.storage, local_dir, f"{self.spec.trial_dir}/{name}", metadata)
        self.outcome.checkpoints.append(
            CheckpointRecord(name, self.clock.iteration, metadata["result"])
        )


def _run_class(run: _SegmentRun, restore_dir: str | None) -> str:
    spec = run.spec
    trainable = spec.trainable(spec.config, trial_id=spec.trial_id)
    try:
        if restore_dir is not None:
            dict_file = os.path.join(restore_dir, DICT_CHECKPOINT_FILE)
            if os.path.exists(dict_file):
                with open(dict_file, "rb") as f:
                    trainable.load_checkpoint(pickle.load(f))
            else:
                trainable.load_checkpoint(restore_dir)
        trainable._iteration = run.clock.iteration
        run.clock.start()
        while True:
            metrics = trainable.step()
            if not isinstance(metrics, dict):
                raise TypeError(
                    f"{type(trainable).__name__}.step() must return a dict, got {metrics!r}"
                )
            result = run.clock.fill(metrics)
            trainable._iteration = run.clock.iteration
            run.outcome.results.append(result)
            reason = run.end_reason(result)
            if run.wants_checkpoint(reason):
                with tempfile.TemporaryDirectory(prefix="popflow-save-") as d:
                    saved = trainable.save_checkpoint(d)
                    if isinstance(saved, dict):
                        with open(os.path.join(d, DICT_CHECKPOINT_FILE), "wb") as f:
                            pickle.dump(saved, f)
                    run.publish(d, result)
            if reason is not None:
                return reason
    finally:
        trainable.cleanup()


def _run_function(run: _SegmentRun, restore_dir: str | None) -> str:
    spec = run.spec
    reason: list[str] = []

    def on_report(metrics: dict[str, Any], checkpoint: Checkpoint | None) -> bool:
        result = run.clock.fill(metrics)
        run.outcome.results.append(result)
        if checkpoint is not None:
            if not checkpoint.is_local:
                raise ValueError(
                    f"report(checkpoint=...) needs a local folder, got {checkpoint.path}"
                )
            run.publish(checkpoint.path, result)
        end = run.end_reason(result)
        if end is not None:
            reason.append(end)
        return end is not None

    restore = Checkpoint(restore_dir) if restore_dir is not None else None
    run.clock.start()
    finished = run_in_session(spec.trainable, spec.config, on_report, restore)
    return "finished" if finished and not reason else reason[0]


def run_segment(spec: SegmentSpec) -> SegmentOutcome:
    """The Dask task: run one segment and return its outcome (errors included, never raised)."""
    seed_globals(spec.seed)
    run: _SegmentRun | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="popflow-restore-") as tmp:
            restore_dir, metadata = None, None
            if spec.restore is not None:
                restore_dir = os.path.join(tmp, "checkpoint")
                metadata = fetch_checkpoint(spec.storage, spec.restore, restore_dir)
            run = _SegmentRun(spec, ProgressClock.restored(spec.trial_id, metadata))
            runner = _run_function if is_function_trainable(spec.trainable) else _run_class
            run.outcome.reason = runner(run, restore_dir)
            return run.outcome
    except Exception:
        outcome = run.outcome if run is not None else SegmentOutcome(trial_id=spec.trial_id)
        outcome.reason = "error"
        outcome.error = traceback.format_exc()
        logger.warning("trial %s failed:\n%s", spec.trial_id, outcome.error)
        return outcome


def run_segments(specs: list[SegmentSpec]) -> list[SegmentOutcome]:
    """Several segments in one Dask task, in order (time-multiplexing on one slot)."""
    return [run_segment(spec) for spec in specs]
