"""Ray Tune's class API: subclass :class:`Trainable` and implement ``setup`` and ``step``.

For PBT and pausing schedulers also implement ``save_checkpoint`` and
``load_checkpoint``; ``reset_config`` lets popflow keep a live trainable when
its trial goes on with a new config (PBT replay changes the config of the
trial that keeps training) instead of building and restoring a new one.

>>> class Quadratic(Trainable):
...     def setup(self, config):
...         self.x = config["x"]
...     def step(self):
...         self.x -= 0.1 * 2 * self.x
...         return {"loss": self.x**2}
>>> t = Quadratic({"x": 1.0})
>>> round(t.step()["loss"], 4)
0.64
"""

from __future__ import annotations

import inspect
from typing import Any

from popflow.tasks.checkpoint import Checkpoint


class Trainable:
    """One trial's training state. popflow builds it on a Dask worker for each segment."""

    def __init__(self, config: dict[str, Any] | None = None, *, trial_id: str = "default") -> None:
        self.config: dict[str, Any] = dict(config or {})
        self._trial_id = trial_id
        self._iteration = 0
        self.setup(dict(self.config))

    @property
    def trial_id(self) -> str:
        return self._trial_id

    @property
    def iteration(self) -> int:
        """Iterations completed so far, counting those before a restore."""
        return self._iteration

    training_iteration = iteration

    @property
    def trial_resources(self) -> Any:
        """Ray's ``Trainable.trial_resources``: what the trial holds now, a
        ``PlacementGroupFactory`` (a ``ResourceChangingScheduler`` changes it from one segment
        to the next, restoring the trainable from its checkpoint); None outside a trial."""
        from popflow.tasks.trial_context import get_context

        try:
            return get_context().get_trial_resources()
        except RuntimeError:  # built outside a trial (validate_save_restore, a test)
            return None

    def setup(self, config: dict[str, Any]) -> None:
        """Build the model, data, optimiser. Called once per trainable object."""

    def step(self) -> dict[str, Any]:
        """Train one iteration and return its metrics."""
        raise NotImplementedError(f"{type(self).__name__} must implement step()")

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any] | None:
        """Write state into ``checkpoint_dir``, or return a picklable dict of it."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement save_checkpoint() to save a checkpoint "
            "(checkpoint_at_end=True, checkpoint_frequency, a result's should_checkpoint, or "
            "a scheduler that pauses or clones trials: PBT, PB2, HyperBand)"
        )

    def load_checkpoint(self, checkpoint: dict[str, Any] | str) -> None:
        """Restore from what ``save_checkpoint`` produced: its dict, or the folder path."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement load_checkpoint() to resume or clone trials"
        )

    def restore(self, checkpoint: Any) -> None:
        """Ray's ``Trainable.restore``: load ``checkpoint`` (a :class:`popflow.tune.Checkpoint`,
        e.g. ``result.checkpoint``, or its path) into this trainable, in one call::

            model = MyTrainable(best.config)
            model.restore(best.checkpoint)
        """
        if not isinstance(checkpoint, Checkpoint):
            checkpoint = Checkpoint(checkpoint)
        checkpoint.load_into(self)

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        """Apply ``new_config`` in place; return True if done (False: build a new object)."""
        return False

    def cleanup(self) -> None:
        """Release resources; called when the object is discarded."""


def is_function_trainable(trainable: object) -> bool:
    """A function trainable (Ray's function API), not a :class:`Trainable` subclass."""
    return not (inspect.isclass(trainable) and issubclass(trainable, Trainable))


def saves_checkpoints(trainable: object) -> bool:
    """Whether ``trainable`` can save its state: a class trainable that implements
    ``save_checkpoint`` (Ray's default, which raises, does not count). A function
    trainable reports its own checkpoints, which is not known before it runs: True."""
    if is_function_trainable(trainable):
        return True
    return getattr(trainable, "save_checkpoint", None) is not Trainable.save_checkpoint


def trainable_name(trainable: Any) -> str:
    """The name a trainable (a class or a function) goes by in trial names and folders."""
    return getattr(trainable, "__name__", type(trainable).__name__)
