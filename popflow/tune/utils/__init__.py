"""``ray.tune.utils``: the helpers Ray Tune's own examples use, and
``validate_save_restore`` (does a Trainable class resume correctly?)."""

from popflow.tasks.save_restore_check import validate_save_restore

__all__ = ["validate_save_restore"]
