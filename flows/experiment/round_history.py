"""Which driver committed which round, and when: the attempts of an experiment, from storage.

Each commit carries, in its state, the last :data:`KEPT` rounds committed by any driver
as ``[epoch, round, began, committed]`` (the driver's lease epoch, the round's number,
when it began and when it was committed, seconds since the epoch on the driver's
clock). It is state, not the round's own record, so it outlives the pruning of old
commits: a driver that resumes learns from its first commit what each earlier driver
committed, even one killed before its Prefect record had caught up (the record writes
them from here, :mod:`popflow.flows.record.attempt_history`). Commits written before
this existed have none; their rounds are not listed.

>>> h = extend([], epoch=1, round_no=0, began=None, at=9.0)  # the experiment's start
>>> h = extend(h, epoch=1, round_no=1, began=10.0, at=12.0)
>>> h = extend(h, epoch=2, round_no=2, began=20.0, at=21.5)
>>> [(a.epoch, a.opened, a.rounds) for a in attempts(h)]
[(1, 9.0, [Round(no=1, began=10.0, at=12.0)]), (2, None, [Round(no=2, began=20.0, at=21.5)])]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

#: The state key of the history (in :data:`popflow.infra.store.commit_log.STATE_KEYS`).
KEY = "attempt_rounds"
#: Rounds kept: a Prefect record trails its training by a few rounds at most, so an
#: attempt's earlier rounds are in Prefect already. Dropped :data:`SLACK` at a time,
#: so that most commits only append to the list (a delta of one item).
KEPT = 256
SLACK = 64


def extend(
    history: list[list[Any]] | None, epoch: int, round_no: int, began: float | None, at: float
) -> list[list[Any]]:
    """``history`` with round ``round_no`` committed at ``at`` by driver ``epoch``."""
    out = [*(history or []), [epoch, round_no, began, at]]
    return out[-KEPT:] if len(out) > KEPT + SLACK else out


class Round(NamedTuple):
    no: int
    began: float | None  # None: its start was not recorded
    at: float


@dataclass
class Attempt:
    """The rounds one driver (lease ``epoch``) committed, oldest first; ``opened``: when
    it started the experiment (its commit of round 0), if it did."""

    epoch: int
    rounds: list[Round] = field(default_factory=list)
    opened: float | None = None

    @property
    def fresh(self) -> bool:
        """It started the experiment (not a resume)."""
        return self.opened is not None or (bool(self.rounds) and self.rounds[0].no == 1)

    @property
    def first(self) -> int:
        """Its first round (1 for one that committed none after starting the experiment)."""
        return self.rounds[0].no if self.rounds else 1

    @property
    def last(self) -> Round:
        """Its last committed round (round 0, the start, when it committed none)."""
        if self.rounds:
            return self.rounds[-1]
        assert self.opened is not None
        return Round(0, None, self.opened)

    @property
    def since(self) -> float:
        """When it started the experiment, or its first round began."""
        if self.opened is not None:
            return self.opened
        first = self.rounds[0]
        return first.began if first.began is not None else first.at


def attempts(history: Any) -> list[Attempt]:
    """The attempts in a commit's ``history`` (its :data:`KEY`), by epoch; a round committed
    twice (a run's final commit) counts once; entries that are not what :func:`extend`
    writes are skipped (a commit is data from storage)."""
    by_epoch: dict[int, Attempt] = {}
    for entry in history if isinstance(history, list) else []:
        parsed = _entry(entry)
        if parsed is None:
            continue
        epoch, one = parsed
        attempt = by_epoch.setdefault(epoch, Attempt(epoch))
        if one.no == 0:
            attempt.opened = one.at
        elif not attempt.rounds or one.no > attempt.rounds[-1].no:
            attempt.rounds.append(one)
    return [by_epoch[e] for e in sorted(by_epoch)]


def _entry(entry: Any) -> tuple[int, Round] | None:
    if not isinstance(entry, list) or len(entry) != 4:
        return None
    epoch, no, began, at = entry
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (no, at))
    if not (
        isinstance(epoch, int) and numbers and (began is None or isinstance(began, int | float))
    ):
        return None
    return epoch, Round(int(no), None if began is None else float(began), float(at))
