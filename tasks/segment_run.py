"""The book-keeping of one running segment, shared by the class and function APIs.

:class:`SegmentRun` records each iteration's result, says when the segment
ends (:class:`~popflow.tasks.specs.EndReason`) and whether to checkpoint, and
publishes checkpoints to storage (beside training, through
:mod:`popflow.tasks.uploads`, when the runner call gives it one).
"""

from __future__ import annotations

import contextlib
import functools
import tempfile
from collections.abc import Iterator
from typing import Any

from popflow.infra.jsonutil import jsonable
from popflow.infra.storage.errors import FULL_ERRNOS, StorageError
from popflow.infra.store.checkpoints import manifest_digest, publish_checkpoint, staging_folder
from popflow.infra.store.layout import checkpoint_name, checkpoint_path
from popflow.infra.store.lease import fence
from popflow.tasks.progress import ProgressClock
from popflow.tasks.progress_events import ProgressSender
from popflow.tasks.result_keys import SHOULD_CHECKPOINT, TRAINING_ITERATION
from popflow.tasks.specs import (
    CheckpointNeed,
    CheckpointRecord,
    EndReason,
    SegmentOutcome,
    SegmentSpec,
    StopCondition,
)
from popflow.tasks.uploads import Uploads


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


class SegmentRun:
    """Book-keeping of one running segment, shared by the class and function APIs."""

    def __init__(self, spec: SegmentSpec, clock: ProgressClock, uploads: Uploads | None = None):
        self.spec = spec
        self.clock = clock
        self.uploads = uploads  # publishes run beside training (popflow.tasks.uploads)
        self.outcome = SegmentOutcome(trial_id=spec.trial_id)
        self.reason: EndReason | None = None
        self._taken = set(spec.taken)
        self._start_iteration = clock.iteration
        self._progress = ProgressSender(spec.progress_topic, spec.trial_id)
        self._staged: str | None = None  # the open checkpoint_folder() on local disk

    def record(self, metrics: dict[str, Any]) -> EndReason | None:
        """Record one iteration's metrics; return why the segment ends here, if it does."""
        if not isinstance(metrics, dict):
            raise TypeError(f"reported metrics must be a dict, got {metrics!r}")
        result = self.clock.fill(metrics, self.spec.iteration_seconds)
        self.outcome.results.append(result)
        self._progress.result(result)
        self.reason = self._end_reason(result)
        return self.reason

    def _end_reason(self, result: dict[str, Any]) -> EndReason | None:
        spec = self.spec
        if result.get("done"):
            return EndReason.DONE
        if should_stop(spec.stop, spec.trial_id, result):
            return EndReason.STOP
        if spec.target is not None:
            if spec.time_attr not in result:
                raise ValueError(
                    f"the scheduler measures time in {spec.time_attr!r}, but the trial's result "
                    f"has no such key; result keys are {sorted(result)}"
                )
            if result[spec.time_attr] >= spec.target:
                return EndReason.MILESTONE
        if (
            spec.max_iterations is not None
            and self.clock.iteration - self._start_iteration >= spec.max_iterations
        ):
            return EndReason.MAX_ITERATIONS
        return None

    def wants_checkpoint(self, reason: EndReason | None) -> CheckpointNeed | None:
        """Whether to save after this iteration (None: no checkpoint).

        A checkpoint at a decision point lets the trial pause, be cloned or
        resume after a crash; a trainable that cannot save still continues live.
        """
        freq = self.spec.checkpoint_frequency
        if freq and self.clock.iteration % freq == 0:
            return CheckpointNeed.REQUIRED
        if self.outcome.results[-1].get(SHOULD_CHECKPOINT) or self.saves_first():
            return CheckpointNeed.REQUIRED
        if reason in (EndReason.DONE, EndReason.STOP) and self.spec.checkpoint_at_end:
            return CheckpointNeed.REQUIRED
        if reason is not None and reason.is_decision_point and self.spec.save_at_decisions:
            return CheckpointNeed.OPTIONAL
        return None

    def saves_first(self) -> bool:
        """The trainable is at the iteration of the result the driver asked to save."""
        first = self.spec.save_first
        return first is not None and first.get(TRAINING_ITERATION) == self.clock.iteration

    @contextlib.contextmanager
    def checkpoint_folder(self) -> Iterator[str]:
        """A folder to save the latest result's checkpoint into, then :meth:`publish`. On
        local disk a staging folder in the trial's own folder, published by a rename;
        else a temporary folder. Removed on exit unless published."""
        staged = staging_folder(self.spec.storage, self.spec.trial_dir)
        if staged is None:
            with tempfile.TemporaryDirectory(prefix="popflow-save-") as folder:
                yield folder
            return
        self._staged = staged
        try:
            yield self.spec.storage.path(staged)
        except OSError as exc:  # the trainable wrote into storage: a full disk is not its fault
            if exc.errno in FULL_ERRNOS and not isinstance(exc, StorageError):
                url = self.spec.storage.full_url(staged)
                raise StorageError("save", url, f"{type(exc).__name__}: {exc}", exc.errno) from exc
            raise
        finally:
            if self._staged is not None:  # not published: nothing may see it
                self.spec.storage.remove(staged)
            self._staged = None

    def publish(
        self,
        local_dir: str,
        known: dict[str, dict[str, Any]] | None = None,
        result: dict[str, Any] | None = None,
    ) -> None:
        """Publish ``local_dir`` as the checkpoint of ``result``, by default the latest
        (``known``: the manifest entries of files popflow wrote there, see
        ``publish_checkpoint``)."""
        result = self.outcome.results[-1] if result is None else result
        # its driver's epoch and its attempt in the name: no other writer publishes under it
        spec = self.spec
        name = checkpoint_name(self.clock.iteration, self._taken, spec.lease_epoch, spec.attempt)
        self._taken.add(name)
        metadata = {**self.clock.metadata(), "result": jsonable(result)}
        if self.spec.lease_epoch:  # whose publish it is: no driver publishes over a newer's
            metadata["epoch"] = self.spec.lease_epoch
        rel_path = checkpoint_path(self.spec.trial_dir, name)
        record = CheckpointRecord(name, self.clock.iteration, metadata["result"])
        self.outcome.checkpoints.append(record)
        storage, epoch = self.spec.storage, self.spec.lease_epoch
        guard = functools.partial(fence, storage, epoch) if epoch else None
        staged = self._staged if self._staged and storage.path(self._staged) == local_dir else None
        if staged is not None:
            self._staged = None  # the publish's now: moved into place, or removed if it fails
        if self.uploads is None:  # a local publish is a rename (a copy for a user's folder)
            try:
                manifest = publish_checkpoint(
                    storage, local_dir, rel_path, metadata, guard, staged=staged, known=known
                )
            except BaseException:  # not published: what is at that name is not this one's
                self.outcome.checkpoints.remove(record)  # (a newer driver's, maybe)
                raise
            record.digest = manifest_digest(manifest)
            return
        if storage.is_local and staged is None:  # a user's folder: theirs again on return
            staged = self._copy_to_staging(local_dir)
        self.uploads.submit(
            self.outcome, record, storage, staged or local_dir, rel_path, metadata, guard, known
        )

    def _copy_to_staging(self, local_dir: str) -> str:
        """A copy of ``local_dir`` in a new staging folder of the (local) storage."""
        storage = self.spec.storage
        staged = staging_folder(storage, self.spec.trial_dir)
        assert staged is not None  # local disk
        try:
            storage.put_dir(local_dir, staged)
        except BaseException:
            storage.remove(staged)
            raise
        return staged
