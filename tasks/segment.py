"""What a Dask worker runs: one trial's segment, from a checkpoint up to a decision point.

A segment continues the trial's live trainable if this worker parked it
(:mod:`popflow.tasks.live`), else builds it and restores it from storage; it trains
until the scheduler's milestone (or a stop condition), saves checkpoints to
storage and returns the results. It never talks to the Prefect API. Storage
holds everything a trial needs to go on, so any worker can run any segment and
a lost worker costs only the segment it was running.
"""

from __future__ import annotations

import inspect
import logging
import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from popflow.infra.checkpoint_store import CheckpointError, fetch_checkpoint, publish_checkpoint
from popflow.infra.cluster import current_worker_address
from popflow.infra.jsonutil import jsonable
from popflow.infra.storage import Storage
from popflow.tasks.live import Live, LiveClass, LiveFunction, UserCodeError, is_parked, park, take
from popflow.tasks.progress import ProgressClock
from popflow.tasks.seeding import isolate_dask_sampling, seed_globals
from popflow.tasks.trainable import Trainable
from popflow.tasks.uploads import Uploads, transfer_threads

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
    live_token: str | None = None  # continue the trainable this worker parked under it


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
    live_token: str | None = None  # the trainable is parked on ``worker`` under this token
    worker: str | None = None
    bad_checkpoint: str | None = None  # the restore checkpoint failed its check on load
    seconds: float = 0.0  # the segment's wall time on the worker, set-up and saves included


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


class SegmentRun:
    """Book-keeping of one running segment, shared by the class and function APIs."""

    def __init__(self, spec: SegmentSpec, clock: ProgressClock, uploads: Uploads | None = None):
        self.spec = spec
        self.clock = clock
        self.uploads = uploads  # object-store uploads run beside training (tasks.uploads)
        self.outcome = SegmentOutcome(trial_id=spec.trial_id)
        self.reason: str | None = None
        self._taken = set(spec.taken)
        self._start_iteration = clock.iteration

    def record(self, metrics: dict[str, Any]) -> str | None:
        """Record one iteration's metrics; return why the segment ends here, if it does."""
        if not isinstance(metrics, dict):
            raise TypeError(f"reported metrics must be a dict, got {metrics!r}")
        result = self.clock.fill(metrics)
        self.outcome.results.append(result)
        self.reason = self._end_reason(result)
        return self.reason

    def _end_reason(self, result: dict[str, Any]) -> str | None:
        spec = self.spec
        if result.get("done"):
            return "done"
        if should_stop(spec.stop, spec.trial_id, result):
            return "stop"
        if spec.target is not None:
            if spec.time_attr not in result:
                raise ValueError(
                    f"the scheduler measures time in {spec.time_attr!r}, but the trial's result "
                    f"has no such key; result keys are {sorted(result)}"
                )
            if result[spec.time_attr] >= spec.target:
                return "milestone"
        if (
            spec.max_iterations is not None
            and self.clock.iteration - self._start_iteration >= spec.max_iterations
        ):
            return "max_iterations"
        return None

    def wants_checkpoint(self, reason: str | None) -> str | None:
        """ "required" (asked for by the user), "optional" (at a decision point), or None.

        A checkpoint at a decision point lets the trial pause, be cloned or
        resume after a crash; a trainable that cannot save still continues live.
        """
        freq = self.spec.checkpoint_frequency
        if freq and self.clock.iteration % freq == 0:
            return "required"
        if reason in ("done", "stop") and self.spec.checkpoint_at_end:
            return "required"
        if reason in ("milestone", "max_iterations"):
            return "optional"
        return None

    def publish(self, local_dir: str) -> None:
        """Publish ``local_dir`` as the checkpoint of the latest result."""
        result = self.outcome.results[-1]
        name = checkpoint_name(self.clock.iteration, self._taken)
        self._taken.add(name)
        metadata = {**self.clock.metadata(), "result": jsonable(result)}
        rel_path = f"{self.spec.trial_dir}/{name}"
        self.outcome.checkpoints.append(
            CheckpointRecord(name, self.clock.iteration, metadata["result"])
        )
        storage = self.spec.storage
        if self.uploads is not None and not storage.is_local:
            self.uploads.submit(self.outcome, storage, local_dir, rel_path, metadata)
        else:  # a local publish is a copy and a rename: no thread to wait for
            publish_checkpoint(storage, local_dir, rel_path, metadata)


Fetched = tuple[str, dict[str, Any] | None]  # (temporary folder, checkpoint metadata)


def _fetch(spec: SegmentSpec) -> Fetched:
    """Download ``spec.restore`` into a new temporary folder (``<tmp>/checkpoint``)."""
    tmp = tempfile.mkdtemp(prefix="popflow-restore-")
    if spec.restore is None:
        return tmp, None
    try:
        return tmp, fetch_checkpoint(spec.storage, spec.restore, os.path.join(tmp, "checkpoint"))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _prefetch(specs: list[SegmentSpec]) -> dict[int, Future[Fetched]]:
    """Start the downloads of the segments that will restore from an object store."""
    return {
        i: transfer_threads().submit(_fetch, spec)
        for i, spec in enumerate(specs)
        if spec.restore is not None
        and not spec.storage.is_local
        and not (spec.live_token and is_parked(spec.live_token))
    }


def _start(spec: SegmentSpec, fetched: Future[Fetched] | None = None) -> Live:
    """Build the trainable, restored from ``spec.restore`` if given (``fetched``: already
    being downloaded)."""
    tmp, metadata = fetched.result() if fetched is not None else _fetch(spec)
    restore_dir = os.path.join(tmp, "checkpoint") if spec.restore is not None else None
    owned = False
    try:
        clock = ProgressClock.restored(spec.trial_id, metadata)
        if is_function_trainable(spec.trainable):
            live: Live = LiveFunction(
                spec.trainable, spec.config, spec.trial_id, restore_dir, clock
            )
            owned = restore_dir is not None  # a live function owns its restore folder
            return live
        return LiveClass(spec.trainable, spec.config, spec.trial_id, restore_dir, clock)
    finally:
        if not owned:
            shutil.rmtree(tmp, ignore_errors=True)


def _resume_or_start(spec: SegmentSpec, fetched: Future[Fetched] | None) -> Live:
    live = take(spec.live_token) if spec.live_token else None
    if live is not None and not live.accepts(spec.config):
        live.discard()
        live = None
    if live is None and spec.live_token:
        logger.info(
            "trial %s: no live trainable here, restoring from %s", spec.trial_id, spec.restore
        )
    return live if live is not None else _start(spec, fetched)


def run_segment(
    spec: SegmentSpec,
    worker: str | None = None,
    uploads: Uploads | None = None,
    fetched: Future[Fetched] | None = None,
) -> SegmentOutcome:
    """Run one segment and return its outcome (errors included, never raised).

    ``worker``: the address of this process's Dask worker, where a trainable
    left alive is parked (looked up when not given). ``uploads``: publish
    object-store checkpoints in the background (the caller waits for them).
    ``fetched``: the download of ``spec.restore``, started earlier.
    """
    start = time.perf_counter()
    outcome = _run_segment(spec, worker, uploads, fetched)
    outcome.seconds = time.perf_counter() - start
    return outcome


def _run_segment(
    spec: SegmentSpec,
    worker: str | None,
    uploads: Uploads | None,
    fetched: Future[Fetched] | None,
) -> SegmentOutcome:
    seed_globals(spec.seed)
    run: SegmentRun | None = None
    live: Live | None = None
    try:
        live = _resume_or_start(spec, fetched)
        run = SegmentRun(spec, live.clock, uploads)
        run.outcome.reason = live.run(run)
        if run.outcome.reason in ("milestone", "max_iterations"):
            run.outcome.live_token = park(live)
            run.outcome.worker = worker or current_worker_address()
        else:
            live.discard()
        return run.outcome
    except Exception as exc:
        outcome = run.outcome if run is not None else SegmentOutcome(trial_id=spec.trial_id)
        outcome.reason = "error"
        outcome.error = exc.args[0] if isinstance(exc, UserCodeError) else traceback.format_exc()
        if isinstance(exc, CheckpointError) and run is None:
            outcome.bad_checkpoint = spec.restore
        logger.warning("trial %s failed:\n%s", spec.trial_id, outcome.error)
        if live is not None:
            try:
                live.discard()
            except Exception:
                logger.exception("cleanup after a failed segment failed")
        return outcome


def run_segments(specs: list[SegmentSpec], worker: str | None = None) -> list[SegmentOutcome]:
    """One or several segments, in order (time-multiplexing on one slot); a
    segment's checkpoint uploads overlap the next one's training, and all are
    published before this returns."""
    uploads = Uploads()
    fetches = _prefetch(specs)
    # trials continuing live first: the others' checkpoints download meanwhile
    order = sorted(range(len(specs)), key=lambda i: i in fetches)
    outcomes: dict[int, SegmentOutcome] = {}
    try:
        for i in order:
            outcomes[i] = run_segment(specs[i], worker, uploads, fetches.pop(i, None))
        return [outcomes[i] for i in range(len(specs))]
    finally:
        uploads.finish()
        for future in fetches.values():  # not used (an earlier segment raised): clean up
            future.add_done_callback(_drop_fetched)


def _drop_fetched(future: Future[Fetched]) -> None:
    if future.exception() is None:
        shutil.rmtree(future.result()[0], ignore_errors=True)
