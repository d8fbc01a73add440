"""What a Dask worker runs: one trial's segment, from a checkpoint up to a decision point.

A segment continues the trial's live trainable if this worker parked it
(:mod:`popflow.tasks.live`), else builds it and restores it from storage; it trains
until the scheduler's milestone (or a stop condition), saves checkpoints to
storage and returns the results. It never talks to the Prefect API. Storage
holds everything a trial needs to go on, so any worker can run any segment and
a lost worker costs only the segment it was running.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import traceback
from concurrent.futures import Future

from popflow.infra.cluster.dask_cluster import current_worker_address
from popflow.infra.storage.errors import StorageError
from popflow.infra.store.checkpoints import CheckpointError, verify_in_place
from popflow.infra.store.lease import LeaseLost
from popflow.schedulers.placement import PlacementGroupFactory
from popflow.tasks.dask_sampling import isolate_dask_sampling
from popflow.tasks.live import Live, LiveClass, LiveFunction, UserCodeError, is_parked, park, take
from popflow.tasks.object_refs import as_object_refs
from popflow.tasks.parameters import parameters_of
from popflow.tasks.progress import ProgressClock
from popflow.tasks.restore_fetch import Fetched, drop_fetched, fetch, take_early
from popflow.tasks.seeding import seed_globals
from popflow.tasks.segment_run import SegmentRun
from popflow.tasks.specs import EndReason, Published, SegmentOutcome, SegmentSpec
from popflow.tasks.trainable import is_function_trainable
from popflow.tasks.trial_context import TuneContext, bound
from popflow.tasks.trial_output import captured
from popflow.tasks.uploads import Uploads, defer, take_deferred, transfer_threads

logger = logging.getLogger(__name__)
isolate_dask_sampling()  # runs on every worker that imports this module


def _verified(spec: SegmentSpec) -> Fetched:
    """Check ``spec.restore`` where it is on local disk (a class trainable loads it there),
    the version committed: (None, its metadata)."""
    assert spec.restore is not None
    return None, verify_in_place(spec.storage, spec.restore, spec.restore_digest)[1]


def _prefetch(specs: list[SegmentSpec]) -> dict[int, Future[Fetched]]:
    """Start the downloads of the segments that will restore from an object store, and
    on local disk the checks of class trainables' checkpoints (they read every byte)."""
    started: dict[int, Future[Fetched]] = {}
    for i, spec in enumerate(specs):
        if spec.restore is None or (spec.live_token and is_parked(spec.live_token)):
            continue
        if not spec.storage.is_local:
            started[i] = take_early(
                spec.storage, spec.restore, spec.restore_digest
            ) or transfer_threads().submit(fetch, spec.storage, spec.restore, spec.restore_digest)
        elif not is_function_trainable(spec.trainable):
            started[i] = transfer_threads().submit(_verified, spec)
    return started


def _build(spec: SegmentSpec, fetched: Future[Fetched] | None = None) -> Live:
    """Build the trainable, restored from ``spec.restore`` if given (``fetched``: already
    being downloaded)."""
    params = parameters_of(spec.trainable)
    if params is not None:  # with_parameters: its objects come from the experiment's folder
        params.attach(spec.storage)
    function = is_function_trainable(spec.trainable)
    config = as_object_refs(spec.config)  # a committed config names its object refs as strings
    if spec.restore is not None and spec.storage.is_local and not function:
        # a class trainable loads its checkpoint at once: where it is, verified (a copy
        # cost each restore as much as the rest of a short segment), as Ray's local ones
        metadata = (fetched.result() if fetched is not None else _verified(spec))[1]
        folder = spec.storage.path(spec.restore)
        clock = ProgressClock.restored(spec.trial_id, metadata)
        return LiveClass(spec.trainable, config, spec.trial_id, folder, clock)
    tmp, metadata = (
        fetched.result()
        if fetched is not None
        else fetch(spec.storage, spec.restore, spec.restore_digest)
    )
    restore_dir = os.path.join(tmp, "checkpoint") if tmp is not None else None
    owned = False
    try:
        clock = ProgressClock.restored(spec.trial_id, metadata)
        if function:
            live: Live = LiveFunction(
                spec.trainable, config, spec.trial_id, restore_dir, clock, context_of(spec)
            )
            owned = restore_dir is not None  # a live function owns its restore folder
            return live
        return LiveClass(spec.trainable, config, spec.trial_id, restore_dir, clock)
    finally:
        if tmp is not None and not owned:
            shutil.rmtree(tmp, ignore_errors=True)


def context_of(spec: SegmentSpec) -> TuneContext:
    """What ``tune.get_context()`` says inside ``spec``'s trial."""
    return TuneContext(
        trial_id=spec.trial_id,
        trial_name=spec.trial_name or spec.trial_id,
        trial_dir=spec.storage.full_url(spec.trial_dir),
        experiment_name=spec.experiment_name,
        trial_resources=spec.resources or PlacementGroupFactory.from_resources(None),
    )


def _continue_or_build(spec: SegmentSpec, fetched: Future[Fetched] | None) -> tuple[Live, bool]:
    """The trial's trainable, and whether it was built here (not continued)."""
    live = take(spec.live_token) if spec.live_token else None
    if live is not None and not live.accepts(spec.config):
        live.discard()
        live = None
    if live is None and spec.live_token:
        logger.info(
            "trial %s: no live trainable here, restoring from %s", spec.trial_id, spec.restore
        )
    return (live, False) if live is not None else (_build(spec, fetched), True)


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
        with (
            bound(context_of(spec)),  # a class trainable is built and runs in this thread
            captured(spec.log_to_file, spec.storage, spec.trial_dir, spec.trial_id),
        ):
            live, built = _continue_or_build(spec, fetched)
            run = SegmentRun(spec, live.clock, uploads)
            run.outcome.restored = built
            run.outcome.reason = live.run(run)
        if run.outcome.reason.is_decision_point:
            run.outcome.live_token = park(live)
            run.outcome.worker = worker or current_worker_address()
        else:
            live.discard()
        return run.outcome
    except BaseException as exc:  # SystemExit or KeyboardInterrupt in user code included:
        # they end this trial, never the worker that runs the others
        outcome = run.outcome if run is not None else SegmentOutcome(trial_id=spec.trial_id)
        outcome.reason = EndReason.ERROR
        outcome.error = exc.args[0] if isinstance(exc, UserCodeError) else traceback.format_exc()
        if isinstance(exc, CheckpointError) and run is None:
            outcome.bad_checkpoint = spec.restore
        if isinstance(exc, StorageError):
            outcome.storage_failure = exc
        if isinstance(exc, LeaseLost):
            outcome.fenced = exc
        logger.warning("trial %s failed:\n%s", spec.trial_id, outcome.error)
        if live is not None:
            try:
                live.discard(failed=True)
            except Exception:
                logger.exception("cleanup after a failed segment failed")
        return outcome


def run_segments(specs: list[SegmentSpec], worker: str | None = None) -> list[SegmentOutcome]:
    """One or several segments, in order (time-multiplexing on one slot); a
    segment's checkpoint uploads overlap the next one's training, and all are
    published before this returns, unless the specs ask to defer them: then the
    outcomes name the publishes still running (``SegmentOutcome.publishing``), for
    :func:`settle_deferred`."""
    uploads = Uploads()
    fetches = _prefetch(specs)
    # trials continuing live first: the others' checkpoints download meanwhile
    order = sorted(range(len(specs)), key=lambda i: i in fetches)
    outcomes: dict[int, SegmentOutcome] = {}
    deferred = False
    try:
        for i in order:
            outcomes[i] = run_segment(specs[i], worker, uploads, fetches.pop(i, None))
        if uploads and any(spec.defer_publish for spec in specs):
            publishing = (worker or current_worker_address() or "", defer(uploads))
            deferred = True
            for outcome in outcomes.values():
                outcome.publishing = publishing
        return [outcomes[i] for i in range(len(specs))]
    finally:
        if not deferred:
            for failed in uploads.finish():  # the trial goes on from its last durable checkpoint
                _discard_parked(failed)
        for future in fetches.values():  # not used (an earlier segment raised): clean up
            drop_fetched(future)


def settle_deferred(token: str) -> Published:
    """Wait for the publishes a deferred call left running here (:func:`run_segments`);
    what they came to. A failed one's parked trainable is dropped (its state was never
    stored)."""
    uploads = take_deferred(token)
    if uploads is None:
        return Published(errors={("", token): "this worker does not know the call's publishes"})
    published, failed = uploads.settle()
    for outcome in failed:
        _discard_parked(outcome)
    return published


def _discard_parked(outcome: SegmentOutcome) -> None:
    if outcome.live_token:
        live = take(outcome.live_token)
        if live is not None:
            live.discard()
        outcome.live_token = outcome.worker = None
