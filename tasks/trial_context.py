"""Ray's ``tune.get_context()``: which trial the code running now belongs to.

Inside a trainable (a function trainable's thread, a ``Trainable``'s methods) it
names the trial, its folder and the experiment::

    ctx = tune.get_context()
    print(ctx.get_trial_name(), ctx.get_trial_dir())

Outside one, ``get_context()`` raises ``RuntimeError`` (what Ray's integrations such
as ``setup_mlflow`` look for to fall back on their own defaults).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TuneContext:
    """Ray's ``TuneContext``: the trial's id, name and folder, the experiment's name."""

    trial_id: str
    trial_name: str
    trial_dir: str  # a local path, or the fsspec URL of an object store's folder
    experiment_name: str
    #: what the trial holds now: a PlacementGroupFactory (Ray's ``get_trial_resources()``)
    trial_resources: Any = None

    def get_trial_id(self) -> str:
        return self.trial_id

    def get_trial_name(self) -> str:
        return self.trial_name

    def get_trial_dir(self) -> str:
        return self.trial_dir

    def get_experiment_name(self) -> str:
        return self.experiment_name

    def get_trial_resources(self) -> Any:
        """The trial's resources as a ``PlacementGroupFactory`` (``.head_cpus``,
        ``.required_resources``): what its current segment's slot holds, changed by a
        ``ResourceChangingScheduler`` from one segment to the next."""
        return self.trial_resources

    # Ray's TuneContext inherits Train's worker getters; under Tune a trial has no
    # worker ranks, so Ray answers None with a DeprecationWarning.
    def get_world_rank(self) -> None:
        return _train_only("get_world_rank")

    def get_world_size(self) -> None:
        return _train_only("get_world_size")

    def get_local_rank(self) -> None:
        return _train_only("get_local_rank")

    def get_local_world_size(self) -> None:
        return _train_only("get_local_world_size")

    def get_node_rank(self) -> None:
        return _train_only("get_node_rank")

    def get_metadata(self) -> dict[str, Any]:
        """Ray's raises this for Tune: it "has never been usable"."""
        raise DeprecationWarning(
            "`get_metadata` is deprecated for Ray Tune, as it has never been usable."
        )


def _train_only(name: str) -> None:
    warnings.warn(
        f"`{name}` is deprecated for Ray Tune: a trial has no worker ranks (Train only); "
        "it returns None",
        DeprecationWarning,
        stacklevel=3,
    )
    return None


logger = logging.getLogger(__name__)


class _Current(threading.local):
    context: TuneContext | None = None


_current = _Current()


def get_context() -> TuneContext:
    """The running trial's context; ``RuntimeError`` outside a trial."""
    if _current.context is None:
        raise RuntimeError("tune.get_context() only works inside a trial run by popflow")
    return _current.context


@contextlib.contextmanager
def bound(context: TuneContext | None) -> Iterator[None]:
    """``context`` is the current trial's in this thread while the block runs."""
    previous, _current.context = _current.context, context
    try:
        yield
    finally:
        _current.context = previous


#: what to do when a trial's trainable object goes (trial id -> callables of ``failed``)
_at_discard: dict[str, list[Callable[[bool], None]]] = {}
_at_discard_lock = threading.Lock()


def at_discard(action: Callable[[bool], None]) -> None:
    """Call ``action(failed)`` when the running trial's trainable object is discarded (the
    trial ended, failed, or was paused long enough to leave its worker)."""
    trial_id = get_context().trial_id
    with _at_discard_lock:
        _at_discard.setdefault(trial_id, []).append(action)


def discarded(trial_id: str, failed: bool = False) -> None:
    """``trial_id``'s trainable object went: its :func:`at_discard` actions run."""
    with _at_discard_lock:
        actions = _at_discard.pop(trial_id, [])
    for action in actions:
        try:
            action(failed)
        except Exception:  # an integration's cleanup never fails the worker
            logger.exception("cleanup after trial %s failed", trial_id)
