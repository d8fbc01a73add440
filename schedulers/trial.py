"""The scheduler's view of a trial: plain data, owned by the controller.

Schedulers read ``status``, ``config`` and ``last_result``; they never change a
trial. What should happen to a trial comes back from the scheduler as a
:class:`~popflow.schedulers.trial_scheduler.Decision`, and the controller applies it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from popflow.schedulers.placement import PlacementGroupFactory


class TrialStatus(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    TERMINATED = "TERMINATED"
    ERROR = "ERROR"

    def __str__(self) -> str:
        return self.value


@dataclass
class Trial:
    """One member of the population.

    ``last_train_time`` is a logical clock set by the controller each time the
    trial is dispatched; schedulers use it for least-recently-trained-first
    fairness (Ray's ``choose_trial_to_run``).
    """

    trial_id: str
    config: dict[str, Any]
    status: TrialStatus = TrialStatus.PENDING
    last_result: dict[str, Any] = field(default_factory=dict)
    last_train_time: float = 0.0
    experiment_tag: str = ""
    #: Ray's ``Trial.trainable_name`` (the trainable's ``__name__``)
    trainable_name: str = ""
    #: what ``trial_name_creator`` named it (None: ``<trainable_name>_<trial_id>``, Ray's)
    custom_name: str | None = None
    #: Ray's ``Trial.path``: the URL of the trial's folder in storage (set by the driver)
    path: str = ""
    #: Ray's: the sampled values of the searched parameters, flattened with "/" keys
    evaluated_params: dict[str, Any] = field(default_factory=dict)
    #: Ray's: the latest checkpoint (a ``popflow.train.Checkpoint``; set by the driver)
    checkpoint: Any = None
    #: Ray's: where the trial's error was written (set by the driver when it fails)
    error_file: str | None = None
    #: Ray's: what the trial holds (set by the driver; a ResourceChangingScheduler's
    #: changes show from the trial's next segment)
    placement_group_factory: PlacementGroupFactory = field(
        default_factory=lambda: PlacementGroupFactory.from_resources(None)
    )
    #: told ``(trial, old_status)`` after each change of ``status`` (:meth:`watch`);
    #: never copied nor pickled
    _watcher: Callable[[Trial, TrialStatus], None] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "status":
            object.__setattr__(self, name, value)
            return
        old = self.__dict__.get("status")
        object.__setattr__(self, name, value)
        watcher = self.__dict__.get("_watcher")
        if watcher is not None and old is not value:
            watcher(self, old)

    def watch(self, watcher: Callable[[Trial, TrialStatus], None] | None) -> None:
        """Have ``watcher(trial, old_status)`` called after each status change (the
        controller keeps its indexes of runnable and live trials current this way)."""
        object.__setattr__(self, "_watcher", watcher)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_watcher"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_watcher", None)

    @property
    def local_path(self) -> str | None:
        """Ray's ``Trial.local_path``: a folder on the driver for files beside the trial (a
        ``LoggerCallback``'s), made on first use. On local storage it is the trial's folder
        (:attr:`path`); on remote storage a staging folder (:func:`driver_folder`) whose
        files the driver copies into the trial's folder every round and when the trial
        ends, as Ray syncs its driver staging folder. None before the driver sets ``path``."""
        if not self.path:
            return None
        folder = driver_folder(self.path)
        os.makedirs(folder, exist_ok=True)
        return folder

    def init_local_path(self) -> None:
        """Ray's: make the folder :attr:`local_path` (Ray's own loggers call it first;
        reading :attr:`local_path` makes it)."""
        if self.local_path is None:
            raise ValueError(f"trial {self.trial_id} has no folder yet (the driver sets path)")

    @property
    def local_experiment_path(self) -> str | None:
        """Ray's: the folder on the driver that holds :attr:`local_path` (the experiment's
        folder on local storage)."""
        local = self.local_path
        return os.path.dirname(local) if local is not None else None

    @property
    def local_dir(self) -> str | None:
        """Ray's alias of :attr:`local_experiment_path`."""
        return self.local_experiment_path

    @property
    def logdir(self) -> str | None:
        """Ray's old name of :attr:`local_path` (Ray 2.60 raises ``DeprecationWarning`` on
        it; popflow warns and answers)."""
        warnings.warn("Use `local_path` instead of `logdir`.", DeprecationWarning, stacklevel=2)
        return self.local_path

    @property
    def is_live(self) -> bool:
        return self.status in (TrialStatus.PENDING, TrialStatus.RUNNING, TrialStatus.PAUSED)

    def is_finished(self) -> bool:
        """Ray's: the trial ended (TERMINATED or ERROR)."""
        return self.status in (TrialStatus.TERMINATED, TrialStatus.ERROR)

    @property
    def custom_trial_name(self) -> str | None:
        """Ray's name of :attr:`custom_name`: what ``trial_name_creator`` gave."""
        return self.custom_name

    def __str__(self) -> str:  # Ray's: how callbacks and logs name a trial
        if self.custom_name is not None:
            return self.custom_name
        return f"{self.trainable_name}_{self.trial_id}" if self.trainable_name else self.trial_id

    def __hash__(self) -> int:  # trials are keys in scheduler bookkeeping
        return hash(self.trial_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Trial) and other.trial_id == self.trial_id


def driver_folder(path: str) -> str:
    """Where files beside the trial at ``path`` (its folder: a local path or a URL) are
    written on the driver: ``path`` itself when local; for a URL, a staging folder
    ``<tmp>/popflow-driver/<experiment hash>/<experiment>/<trial folder>`` (Ray's is under
    its session's ``driver_artifacts``), the same for the same URL."""
    if "://" not in path:
        return path
    experiment, trial_dir = path.rstrip("/").rsplit("/", 1)
    parent, name = experiment.rsplit("/", 1)
    digest = hashlib.sha256(parent.encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), "popflow-driver", digest, name, trial_dir)
