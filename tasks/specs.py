"""What the driver and a worker exchange about one segment: its spec, its outcome, why it ended.

A segment runs one trial from a checkpoint up to a decision point. The driver
sends a :class:`SegmentSpec` (picklable), the worker answers a
:class:`SegmentOutcome` whose ``reason`` is an :class:`EndReason`.
Checkpoints live at :func:`popflow.infra.store.layout.checkpoint_path` under the experiment's
storage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any

from popflow.infra.storage.errors import StorageError
from popflow.infra.storage.folder import Storage
from popflow.infra.store.lease import LeaseLost

StopCondition = Mapping[str, Any] | Callable[[str, dict[str, Any]], bool] | None


class EndReason(StrEnum):
    """Why a segment ended."""

    MILESTONE = "milestone"  # the scheduler's next decision point (time_attr reached target)
    MAX_ITERATIONS = "max_iterations"  # as many iterations as the spec allowed
    DONE = "done"  # the trainable reported done=True
    STOP = "stop"  # the run's stop condition
    FINISHED = "finished"  # a function trainable returned
    ERROR = "error"

    @property
    def is_terminal(self) -> bool:
        """The trial is over (it does not run again)."""
        return self in (EndReason.DONE, EndReason.STOP, EndReason.FINISHED)

    @property
    def is_decision_point(self) -> bool:
        """The trial may go on: its trainable is parked on the worker, a checkpoint is useful."""
        return self in (EndReason.MILESTONE, EndReason.MAX_ITERATIONS)


class CheckpointNeed(Enum):
    """Whether a segment must save a checkpoint after an iteration."""

    REQUIRED = "required"  # asked for by the user (frequency, at end): saving must work
    OPTIONAL = "optional"  # at a decision point: a trainable that cannot save continues live


@dataclass(frozen=True)
class SegmentSpec:
    """Everything a worker needs to run one segment (picklable)."""

    trainable: Any  # a popflow.Trainable subclass or a function trainable
    trial_id: str
    trial_dir: str  # relative to ``storage``
    config: dict[str, Any]
    storage: Storage
    seed: int
    restore: str | None = None  # checkpoint folder relative to ``storage``
    restore_digest: str | None = None  # its committed version (``CheckpointRecord.digest``)
    time_attr: str | None = None
    target: float | None = None  # end the segment once result[time_attr] >= target
    max_iterations: int | None = None  # end the segment after this many iterations
    stop: StopCondition = None
    checkpoint_frequency: int = 0
    checkpoint_at_end: bool = True
    #: save at MILESTONE and MAX_ITERATIONS ends (False: those ends are only for the
    #: driver to see each result, and saving there would checkpoint every iteration)
    save_at_decisions: bool = True
    #: a driver-side callback asked for a checkpoint at this result (``should_checkpoint``)
    #: after the segment that reached it ended: saved once the trainable is at its iteration
    save_first: dict[str, Any] | None = None
    taken: frozenset[str] = frozenset()  # checkpoint names this trial has or is deleting
    live_token: str | None = None  # continue the trainable this worker parked under it
    lease_epoch: int = 0  # the driver's lease: no checkpoint is published once a newer exists
    #: the trial's segment attempt in that epoch: from 2 on its checkpoint names carry it,
    #: names no earlier dispatch of the trial wrote (layout.checkpoint_name)
    attempt: int = 1
    progress_topic: str | None = None  # send the latest result meanwhile (tasks.progress_events)
    #: what ``tune.get_context()`` says in the trial: its name and its experiment's
    trial_name: str = ""
    experiment_name: str = ""
    #: its ``get_trial_resources()``: a PlacementGroupFactory (None: Ray's one CPU)
    resources: Any = None
    #: the Dask resources its slot must hold, where they differ by trial (a
    #: ResourceChangingScheduler's run); None: the run's, as every slot holds
    slot_resources: dict[str, float] | None = None
    #: ``RunConfig.log_to_file``: files in the trial's folder that also take its output
    log_to_file: Any = False
    #: a simulation's clock: the seconds each iteration took, from its metrics (None: measured)
    iteration_seconds: Callable[[dict[str, Any]], float] | None = None
    #: the end of the run's time budget (Ray's ``time_budget_s`` or popflow's
    #: ``run_budget_s``), in seconds since the epoch: the segment ends
    #: (``EndReason.STOP``, ``SegmentOutcome.at_deadline``) at its first report at or past it
    end_by: float | None = None
    #: return once the call's segments have trained, its checkpoints still publishing;
    #: the driver settles them (``SegmentRunner.settle``) before its commit names them
    defer_publish: bool = False


@dataclass
class CheckpointRecord:
    name: str  # folder name under the trial folder
    iteration: int
    result: dict[str, Any]
    #: how many of its trial's logged results the checkpoint's state accounts for (the
    #: driver sets it; None in commits written before it was kept)
    results: int | None = None
    #: the published version's manifest digest (``manifest_digest``; None in commits
    #: written before it was kept): a worker's own copy of that version may serve a restore
    digest: str | None = None
    #: how many exploits its trial had had when it was written (the driver sets it; None
    #: in commits written before it was kept): a fallback stays within one lineage
    exploit: int | None = None


@dataclass
class SegmentOutcome:
    trial_id: str
    results: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[CheckpointRecord] = field(default_factory=list)
    reason: EndReason = EndReason.ERROR
    error: str | None = None
    live_token: str | None = None  # the trainable is parked on ``worker`` under this token
    worker: str | None = None
    bad_checkpoint: str | None = None  # the restore checkpoint failed its check on load
    #: storage failed for good (a full disk, a permission, retries ran out): the run's
    #: failure, not the trial's
    storage_failure: StorageError | None = None
    #: a checkpoint's publish found a newer driver's lease (a stalled driver's segment):
    #: the driver stops with it, and deletes nothing (that name is the newer driver's)
    fenced: LeaseLost | None = None
    seconds: float = 0.0  # the segment's wall time on the worker, set-up and saves included
    #: it ended at ``SegmentSpec.end_by`` (the run's time budget), not by its own stop
    at_deadline: bool = False
    #: the trainable was built for this segment (from ``restore``, or from scratch), not
    #: continued from a parked one: its results follow the restored state, and any the
    #: trial logged after that state are superseded
    restored: bool = False
    #: (an error) the trial's worker process died while its segment was the one running
    #: there: it took the process down, or was there when something else did
    lost_worker: bool = False
    #: (worker address, token) of the call's publishes still running there
    #: (``SegmentSpec.defer_publish``); its checkpoints' digests come when they settle
    publishing: tuple[str, str] | None = None


@dataclass
class Published:
    """What a call's deferred checkpoint publishes came to, keyed by (trial id,
    checkpoint name): the versions' digests, or why a publish failed."""

    digests: dict[tuple[str, str], str] = field(default_factory=dict)
    errors: dict[tuple[str, str], str] = field(default_factory=dict)
    #: storage failed for good: the run's failure (see ``SegmentOutcome.storage_failure``)
    storage_failure: StorageError | None = None
    #: a publish found a newer driver's lease (see ``SegmentOutcome.fenced``)
    fenced: LeaseLost | None = None
