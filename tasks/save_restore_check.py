"""Ray's ``tune.utils.validate_save_restore``: does a Trainable class resume correctly?

It runs the class as popflow's workers do, in this process: three iterations, a
checkpoint, then a new object restored from that checkpoint, which must go on at
iterations 4 and 5. A class whose ``save_checkpoint``/``load_checkpoint`` lose the
iteration or fail is named before a run depends on them (PBT, pausing schedulers, resume).
"""

from __future__ import annotations

import logging
import tempfile
from typing import Any

from popflow.infra.storage.folder import Storage
from popflow.infra.store.layout import checkpoint_path
from popflow.tasks.live import discard_parked
from popflow.tasks.result_keys import TRAINING_ITERATION
from popflow.tasks.segment import run_segment
from popflow.tasks.specs import EndReason, SegmentOutcome, SegmentSpec
from popflow.tasks.trainable import is_function_trainable

logger = logging.getLogger(__name__)

_TRIAL = "validate_save_restore"


def validate_save_restore(
    trainable_cls: type, config: dict[str, Any] | None = None, num_gpus: int = 0
) -> bool:
    """True if ``trainable_cls`` saves and restores correctly; an ``AssertionError``
    naming what went wrong otherwise (as Ray's). ``num_gpus`` is taken for Ray's
    signature: the check runs in this process, on what it has."""
    if is_function_trainable(trainable_cls):
        raise TypeError(
            f"validate_save_restore checks a Trainable class, got {trainable_cls!r}: a "
            "function trainable saves what it reports with tune.report(checkpoint=...)"
        )
    if num_gpus:
        logger.info(
            "validate_save_restore runs in this process: num_gpus=%s is not reserved", num_gpus
        )
    with tempfile.TemporaryDirectory(prefix="popflow-validate-") as root:
        storage = Storage(root)
        spec = {
            "trainable": trainable_cls,
            "trial_id": _TRIAL,
            "trial_dir": _TRIAL,
            "config": dict(config or {}),
            "storage": storage,
            "seed": 0,
        }
        first = _run(SegmentSpec(**spec, max_iterations=3, checkpoint_frequency=3), "train")
        if not first.results or not first.results[-1].get(TRAINING_ITERATION):
            raise AssertionError(
                "Validation will not pass because it requires `training_iteration` to be returned."
            )
        if not first.checkpoints:
            raise AssertionError(f"{trainable_cls.__name__} saved no checkpoint")
        restore = checkpoint_path(_TRIAL, first.checkpoints[-1].name)
        again = _run(SegmentSpec(**spec, restore=restore, max_iterations=2), "restore")
        got = [r.get(TRAINING_ITERATION) for r in again.results]
        if got != [4, 5]:
            raise AssertionError(
                f"{trainable_cls.__name__} restored from its checkpoint at iteration 3 went on "
                f"at iterations {got}, not [4, 5]"
            )
    return True


def _run(spec: SegmentSpec, what: str) -> SegmentOutcome:
    outcome = run_segment(spec)
    if outcome.live_token:
        discard_parked([outcome.live_token])
    if outcome.reason == EndReason.ERROR:
        raise AssertionError(f"{spec.trainable.__name__} failed to {what}:\n{outcome.error}")
    return outcome
