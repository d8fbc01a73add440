"""Where a trial's next segment ends and what it saves, besides the scheduler's
milestone: checkpoint frequency, a stopper or a callback that must see each result
before the next step, and a checkpoint a callback asked for (Ray's ``SHOULD_CHECKPOINT``)
after the segment that reached it had ended."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from popflow.flows.experiment.trial_table import TrialRecord
from popflow.tasks.result_keys import TRAINING_ITERATION
from popflow.tasks.specs import SegmentOutcome

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Cut:
    """``SegmentSpec``'s ``max_iterations`` and ``save_at_decisions``."""

    max_iterations: int | None
    save_at_decisions: bool


def cut(target: float | None, frequency: int, stopper: bool, each_result: bool) -> Cut:
    """Without a scheduler milestone (``target``) a segment ends at checkpoints, so that
    progress is committed; a stopper (on the driver) sees every result before the next
    step, and so does a callback that acts on results (``each_result``: it may ask for a
    checkpoint). Segments cut for such a callback alone are no decision points worth a
    save."""
    if target is not None:
        return Cut(None, True)
    if each_result:
        return Cut(1, stopper)
    return Cut(frequency or (1 if stopper else None), True)


def ask_to_save(rec: TrialRecord, outcome: SegmentOutcome, ended: bool) -> None:
    """A callback asked for a checkpoint in this segment: the trainable saves the
    segment's last result first thing next segment, unless that result has one. The
    asked-for result is the last but where a milestone let the segment run several
    iterations (then the state of the later one is saved)."""
    last = outcome.results[-1]
    iteration = last.get(TRAINING_ITERATION)
    if any(c.iteration == iteration for c in outcome.checkpoints):
        return
    if ended:
        logger.warning(
            "trial %s ended at the result a callback asked to checkpoint: its state is "
            "gone (set CheckpointConfig(checkpoint_at_end=True) to keep it)",
            rec.trial_id,
        )
        return
    rec.save_first = _without_config(last)


def _without_config(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "config"}
