"""A synchronous round's commit written while the next round trains.

On an object store the last checkpoint of each runner call is still uploading
when its segments have trained: waiting for it ended every round with the
slowest upload (moto's server on 2 cores: a 100 MB checkpoint took 1-2 s, a
fifth of a 10 s round). So, with a synchronous scheduler on an object store,
calls return once their segments have trained (``SegmentSpec.defer_publish``)
and the round goes on:

1. the round's results are reduced and its commit is prepared (what it
   stores is fixed then: the same as without this), not yet written;
2. the next round is planned; the segments that do not restore a checkpoint
   still publishing (trials continuing live, and any whose checkpoint is
   committed) are sent at once;
3. the driver waits for the round's publishes (:class:`Publishing`), fills the
   checkpoints' digests in and writes the commit; then the remaining segments
   (PBT's clones, say) are sent, to the runners their packs went to.

A round is still committed or it did not happen: its commit is written only
once every checkpoint it names is stored. What a crash before that loses is
what it lost before: the round, run again on resume. A publish that fails
after its round was reduced cannot be taken back out of the scheduler's
decisions: the driver raises :class:`RoundLost`, and the run goes on from its
last commit, as a resume would (:mod:`popflow.flows.api.training`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from popflow.infra.store.json_delta import Changed
from popflow.schedulers import TrialStatus
from popflow.tasks.specs import CheckpointRecord, SegmentOutcome

if TYPE_CHECKING:
    from popflow.flows.driver.backend import Backend
    from popflow.flows.experiment.trial_table import TrialRecord


class RoundLost(RuntimeError):
    """Round ``round_no``'s results were decided on, but not all its checkpoints reached
    storage (the worker holding them died first): the run goes on from its last commit."""

    def __init__(self, round_no: int, reasons: list[str]) -> None:
        self.round_no = round_no
        self.reasons = reasons
        super().__init__(
            f"round {round_no}'s checkpoints were not all stored ({'; '.join(reasons[:3])})"
        )


@dataclass
class PreparedCommit:
    """A commit built, not yet written (:meth:`Controller.commit` with ``hold``)."""

    round: int
    payload: dict[str, Any]
    logs_through: int
    final: bool
    retired: list[tuple[str, str]]
    results: int
    notes: list[str] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    #: trials by status, and the scheduler's word on itself, as the round ended
    counts: dict[TrialStatus, int] = field(default_factory=dict)
    scheduler: str = ""

    @classmethod
    def of(cls, held: bool, payload: dict[str, Any], **fields: Any) -> PreparedCommit:
        """``held``: written later, so fixed as it is now (the next round's planning
        changes the objects it refers to)."""
        return cls(payload=copy.deepcopy(payload) if held else payload, **fields)


class Publishing:
    """The checkpoints returned calls are still publishing, until :meth:`settle`."""

    def __init__(self) -> None:
        self.calls: set[tuple[str, str]] = set()  # (worker, token) of each such call
        self._records: dict[tuple[str, str], CheckpointRecord] = {}
        self._paths: set[str] = set()

    def __bool__(self) -> bool:
        return bool(self.calls)

    def note(self, outcomes: Iterable[SegmentOutcome], by_id: dict[str, TrialRecord]) -> None:
        """Outcomes just returned: those whose call left publishes running."""
        for outcome in outcomes:
            if outcome.publishing is None:
                continue
            self.calls.add(outcome.publishing)  # an error's checkpoints are kept too
            rec = by_id[outcome.trial_id]
            for ckpt in outcome.checkpoints:
                self._records[(outcome.trial_id, ckpt.name)] = ckpt
                self._paths.add(rec.checkpoint_path(ckpt.name))

    def pending(self, path: str | None) -> bool:
        """``path`` (a checkpoint, relative to the experiment) is still publishing."""
        return path is not None and path in self._paths

    def settle(self, backend: Backend, round_no: int, prepared: PreparedCommit | None) -> None:
        """Wait for every publish; the checkpoints' digests go into their records and
        ``prepared``'s copy of them. Raises the storage's failure, else :class:`RoundLost`
        if any publish did not happen."""
        if not self.calls:
            return
        calls, records = self.calls, self._records
        self.calls, self._records, self._paths = set(), {}, set()
        digests: dict[tuple[str, str], str] = {}
        reasons: list[str] = []
        for published in backend.settle(calls):
            if published.fenced is not None:  # a newer driver holds the lease
                raise published.fenced
            if published.storage_failure is not None:
                raise published.storage_failure
            digests.update(published.digests)
            reasons += [
                f"{key[0] or 'a call'}: {why}"
                for key, why in published.errors.items()
                if key in records or not key[0]  # a call's, or a checkpoint the round uses
            ]
        missing = [f"{trial}/{name}" for trial, name in records if (trial, name) not in digests]
        if reasons or missing:
            raise RoundLost(round_no, reasons or [f"no word of {m}" for m in missing])
        for key, ckpt in records.items():
            ckpt.digest = digests[key]
        if prepared is not None:
            _fill_digests(prepared.payload, digests)


def _fill_digests(payload: dict[str, Any], digests: dict[tuple[str, str], str]) -> None:
    trials = payload["trials"]
    states = trials.items.values() if isinstance(trials, Changed) else trials
    for state in states:
        for ckpt in state["checkpoints"]:
            if ckpt["digest"] is None:
                ckpt["digest"] = digests.get((state["trial_id"], ckpt["name"]))


def split_pending(
    recs: list[TrialRecord], worker: str | None, publishing: Publishing
) -> tuple[list[TrialRecord], list[TrialRecord]]:
    """A pack's trials that may start now at ``worker`` (continuing the trainable parked
    there, or restoring a stored checkpoint), and those to send once the round's
    publishes are settled (they restore a checkpoint still publishing)."""
    now, later = [], []
    for rec in recs:
        live_here = rec.live is not None and rec.live[1] == worker
        (later if publishing.pending(rec.restore) and not live_here else now).append(rec)
    return now, later
