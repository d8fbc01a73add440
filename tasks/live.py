"""Trainables kept alive in a worker process between segments.

A segment ends at every scheduler decision point (a rung, a perturbation
interval). When the decision is "continue", rebuilding the trainable and
reloading its checkpoint would cost a setup per segment, and a function
trainable that never checkpoints (Ray's ``async_hyperband_example``) could not
continue at all. So a segment that ends at a milestone *parks* its trainable
here under a token; the controller sends the trial's next segment to the same
worker with that token and training goes on where it stopped, as with Ray's
long-lived trial actors. Anything else (a pause, a clone, a stop, a lost
worker) discards the live trainable and the trial restarts from its
checkpoint.

- class API: the :class:`~popflow.tasks.trainable.Trainable` object is kept;
  ``reset_config`` applies a changed config in place (else it is rebuilt).
- function API: the function runs in its own thread and waits inside
  ``report()`` between segments.
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import shutil
import threading
import time
import traceback
import uuid
from typing import TYPE_CHECKING, Any

from popflow.infra.store.checkpoints import DigestingWriter
from popflow.infra.store.layout import DICT_CHECKPOINT_FILE
from popflow.tasks.checkpoint import Checkpoint, load_folder
from popflow.tasks.function_api import run_in_session
from popflow.tasks.progress import ProgressClock
from popflow.tasks.specs import CheckpointNeed, EndReason
from popflow.tasks.trainable import Trainable
from popflow.tasks.trial_context import TuneContext, bound, discarded

if TYPE_CHECKING:
    from popflow.tasks.segment_run import SegmentRun

logger = logging.getLogger(__name__)

#: A parked trainable nobody continued for this long is discarded (driver gone).
PARK_TTL_S = 900.0


class UserCodeError(Exception):
    """The trainable raised; ``args[0]`` is its formatted traceback."""


def at_deadline(run: SegmentRun, reason: EndReason | None) -> EndReason | None:
    """Why the segment ends after the report just recorded: ``reason``, or a stop at the
    run's time budget (``SegmentSpec.end_by``). So a trainable that never reaches a
    decision point (a function reporting for ever) still ends on time, with the reports
    it made, as Ray's ``TimeoutStopper`` ends it, and frees its slot."""
    end_by = run.spec.end_by
    if reason is None and end_by is not None and time.time() >= end_by:
        run.reason = reason = EndReason.STOP
        run.outcome.at_deadline = True  # the driver tells this end from the trial's own
    return reason


class LiveClass:
    """A class trainable object that outlives its segment."""

    def __init__(
        self,
        trainable_cls: type[Trainable],
        config: dict[str, Any],
        trial_id: str,
        restore_dir: str | None,
        clock: ProgressClock,
    ) -> None:
        self.config = config
        self.clock = clock
        self.trial_id = trial_id
        self.trainable = trainable_cls(config, trial_id=trial_id)
        if restore_dir is not None:
            load_folder(self.trainable, restore_dir)
        self.trainable._iteration = clock.iteration

    def accepts(self, config: dict[str, Any]) -> bool:
        if config == self.config:
            return True
        if self.trainable.reset_config(dict(config)):
            self.config = self.trainable.config = config
            return True
        return False

    def run(self, run: SegmentRun) -> EndReason:
        if run.saves_first():  # still at the result the driver asked to save: save it now
            self._save(run, required=True, result=run.spec.save_first)
        self.clock.start()
        while True:
            metrics = self.trainable.step()
            if not isinstance(metrics, dict):
                raise TypeError(
                    f"{type(self.trainable).__name__}.step() must return a dict, got {metrics!r}"
                )
            reason = at_deadline(run, run.record(metrics))
            self.trainable._iteration = self.clock.iteration
            need = run.wants_checkpoint(reason)
            if need is not None:
                self._save(run, required=need == CheckpointNeed.REQUIRED)
            if reason is not None:
                return reason

    def _save(self, run: SegmentRun, required: bool, result: dict[str, Any] | None = None) -> None:
        with run.checkpoint_folder() as d:
            try:
                saved = self.trainable.save_checkpoint(d)
            except NotImplementedError:
                if required:
                    raise
                return  # no checkpoint: the trial can only continue live
            known = None
            if isinstance(saved, dict):
                with open(os.path.join(d, DICT_CHECKPOINT_FILE), "wb") as f:
                    out = DigestingWriter(f)
                    pickle.dump(saved, out)
                known = {DICT_CHECKPOINT_FILE: out.entry()}
            run.publish(d, known, result)

    def discard(self, failed: bool = False) -> None:
        try:
            self.trainable.cleanup()
        finally:
            discarded(self.trial_id, failed)


class LiveFunction:
    """A function trainable in its own thread, waiting in ``report()`` between segments."""

    def __init__(
        self,
        fn: Any,
        config: dict[str, Any],
        trial_id: str,
        restore_dir: str | None,
        clock: ProgressClock,
        context: TuneContext | None = None,
    ) -> None:
        self.fn = fn
        self.trial_id = trial_id
        self.context = context  # tune.get_context() in the function's own thread
        self.config = config
        self.clock = clock
        self._restore_dir = restore_dir  # owned: the function may read it lazily
        self._commands: queue.Queue[SegmentRun | None] = queue.Queue()
        self._events: queue.Queue[tuple[str, str | None]] = queue.Queue()
        self._segment: SegmentRun | None = None
        self._thread = threading.Thread(target=self._main, name=f"trial-{trial_id}", daemon=True)

    def accepts(self, config: dict[str, Any]) -> bool:
        return config == self.config  # a running function cannot take a new config

    def _main(self) -> None:
        restore = Checkpoint(self._restore_dir) if self._restore_dir else None
        try:
            with bound(self.context):
                finished = run_in_session(self.fn, self.config, self._on_report, restore)
            self._events.put(("finished" if finished else "discarded", None))
        except BaseException:  # the thread must always answer the segment waiting on it
            self._events.put(("error", traceback.format_exc()))

    def _on_report(self, metrics: dict[str, Any], checkpoint: Checkpoint | None) -> bool:
        assert self._segment is not None
        if checkpoint is not None and not checkpoint.is_local:
            raise ValueError(f"report(checkpoint=...) needs a local folder, got {checkpoint.path}")
        reason = at_deadline(self._segment, self._segment.record(metrics))
        if checkpoint is not None:
            self._segment.publish(checkpoint.path)
        if reason is None:
            return False
        self._events.put(("segment_end", None))
        following = self._commands.get()  # park here until continued or discarded
        if following is None:
            return True  # report() raises SegmentEnd and the thread unwinds
        self._segment = following
        self.clock.start()
        return False

    def run(self, run: SegmentRun) -> EndReason:
        self._segment = run
        if not self._thread.is_alive() and self._thread.ident is None:
            self.clock.start()
            self._thread.start()
        else:
            self._commands.put(run)
        kind, payload = self._events.get()
        if kind == "error":
            raise UserCodeError(payload)
        if kind == "segment_end":
            assert run.reason is not None
            return run.reason
        if run.outcome.results:  # Ray's: the last result of a function that returned says done
            run.outcome.results[-1]["done"] = True
        return run.reason or EndReason.FINISHED

    def discard(self, failed: bool = False) -> None:
        if self._thread.is_alive():
            self._commands.put(None)
            self._thread.join(timeout=10)
        if self._restore_dir:
            shutil.rmtree(os.path.dirname(self._restore_dir), ignore_errors=True)
        discarded(self.trial_id, failed)


Live = LiveClass | LiveFunction

_parked: dict[str, tuple[Live, float]] = {}
_lock = threading.Lock()


def park(live: Live) -> str:
    """Keep ``live`` in this process; return the token that continues it."""
    token = uuid.uuid4().hex
    now = time.monotonic()
    with _lock:
        expired = [t for t, (_, at) in _parked.items() if now - at > PARK_TTL_S]
        stale = [_parked.pop(t)[0] for t in expired]
        _parked[token] = (live, now)
    for old in stale:
        logger.warning("discarding a trainable parked for over %.0f s", PARK_TTL_S)
        old.discard()
    return token


def is_parked(token: str) -> bool:
    with _lock:
        return token in _parked


def take(token: str) -> Live | None:
    with _lock:
        entry = _parked.pop(token, None)
    return entry[0] if entry else None


def discard_parked(tokens: list[str]) -> int:
    """Discard parked trainables; returns how many."""
    found = [live for live in (take(t) for t in tokens) if live is not None]
    for live in found:
        try:
            live.discard()
        except Exception:
            logger.exception("cleanup of a parked trainable failed")
    return len(found)


async def discard_parked_soon(tokens: list[str]) -> None:
    """Discard in a background thread (called on the worker's event loop, by the runner
    actor), so a slow ``cleanup()`` never blocks it."""
    threading.Thread(
        target=discard_parked, args=(tokens,), name="discard-parked", daemon=True
    ).start()
