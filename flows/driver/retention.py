"""Checkpoint retention: which checkpoints a commit retires, and their deletion after it.

``CheckpointConfig.num_to_keep`` keeps each trial's best (or newest) N, and
always its newest one; a checkpoint any trial will restore from, or that an unended
trial's lineage started from (its fallback, :func:`~popflow.flows.experiment.fallback.pinned`),
is never retired. Retired checkpoints are deleted by a background thread once the
commit after the one that retired them is published (so falling back one
commit always finds its checkpoints), off the round's path (an object store
takes a request or two per checkpoint).
"""

from __future__ import annotations

import logging
import math
from concurrent.futures import Future
from typing import Any

from popflow.flows.experiment.fallback import pinned
from popflow.flows.experiment.trial_table import TrialRecord
from popflow.flows.spec.config import CheckpointConfig
from popflow.infra.helper_threads import helper_pool
from popflow.infra.storage.folder import Storage

logger = logging.getLogger(__name__)


def _score(result: dict[str, Any], attr: str, sign: float) -> float:
    value = result.get(attr)
    try:
        score = sign * float(value)
    except (TypeError, ValueError):
        return float("-inf")
    return float("-inf") if math.isnan(score) else score


def retire_checkpoints(records: list[TrialRecord], cfg: CheckpointConfig) -> list[tuple[str, str]]:
    """Drop the checkpoints ``cfg`` does not keep from ``records``; return them as
    (trial folder, checkpoint name) pairs."""
    if cfg.num_to_keep is None:
        return []
    referenced = pinned(records)
    attr = cfg.checkpoint_score_attribute
    sign = 1.0 if cfg.checkpoint_score_order == "max" else -1.0
    retired: list[tuple[str, str]] = []
    for rec in records:
        if len(rec.checkpoints) <= cfg.num_to_keep:
            continue
        order = list(range(len(rec.checkpoints)))
        if attr is not None:  # best first; ties and missing scores favour the newer
            order.sort(
                key=lambda i: (_score(rec.checkpoints[i].result, attr, sign), i), reverse=True
            )
        else:
            order.reverse()
        keep = set(order[: cfg.num_to_keep]) | {len(rec.checkpoints) - 1}
        kept = []
        for i, ckpt in enumerate(rec.checkpoints):
            if i in keep or rec.checkpoint_path(ckpt.name) in referenced:
                kept.append(ckpt)
            else:
                retired.append((rec.dirname, ckpt.name))
        rec.checkpoints = kept
    return retired


class Janitor:
    """Deletes retired checkpoints in a background thread, one commit late.

    The checkpoints commit N retires are still referenced by commit N-1, the
    one a resume falls back to if commit N turns out damaged; so they are
    deleted once commit N+1 is durable (:meth:`committed`). A name retired or
    being deleted is not reused (:meth:`deleting`): the deletion would hit
    the new checkpoint.
    """

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._thread = helper_pool(1, "popflow-retention")
        self._pending: list[tuple[str, str]] = []  # retired by the newest commit
        self._deleting: dict[tuple[str, str], Future[None]] = {}

    @property
    def pending(self) -> bool:
        """Some retired checkpoints wait for one more commit."""
        return bool(self._pending)

    def deleting(self, trial_dir: str) -> set[str]:
        """Names of ``trial_dir``'s checkpoints retired and not yet deleted."""
        keys = [*self._pending, *self._deleting]
        return {name for d, name in keys if d == trial_dir}

    def committed(self, retired: list[tuple[str, str]], wait: bool = False) -> None:
        """A commit retiring ``retired`` is durable: delete what the one before retired.

        ``wait``: finish every deletion started (the run ends).
        """
        doomed, self._pending = self._pending, list(retired)
        for key in doomed:
            self._deleting[key] = self._thread.submit(self._remove, *key)
        for key, deletion in list(self._deleting.items()):
            if wait or deletion.done():
                deletion.result()
                del self._deleting[key]

    def _remove(self, trial_dir: str, name: str) -> None:
        try:
            self.storage.remove(trial_dir, name)
        except Exception as exc:  # garbage, not data: the run goes on, a resume removes it
            logger.warning("could not delete retired checkpoint %s/%s: %s", trial_dir, name, exc)

    def close(self) -> None:
        """Finish the deletions started; what waits for a commit stays (a resume removes it)."""
        for key, deletion in list(self._deleting.items()):
            deletion.result()
            del self._deleting[key]
        self._thread.shutdown()
