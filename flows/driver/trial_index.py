"""The controller's indexes over its trial records, kept current as statuses change.

With thousands of trials, scanning the whole table for each planned segment
makes a run quadratic: 10,000 one-iteration trials spent most of the driver's
time in such scans. The index is told of every status change (each trial's
:meth:`~popflow.schedulers.trial.Trial.watch`) and of every other change to a
record (:meth:`TrialIndex.touch`), and keeps:

- the runnable trials (PENDING or PAUSED) in record order, offered to the
  scheduler's ``choose_trial_to_run`` as a lazy sequence, so FIFO's "first
  pending trial" costs O(1);
- the count of live trials, and of live trials that have started (Ray's
  ``max_concurrent_trials``);
- the records changed since the last commit, so a commit writes only their rows.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterator, Sequence
from typing import overload

from popflow.flows.experiment.trial_table import TrialRecord
from popflow.schedulers import Trial, TrialStatus


def started(rec: TrialRecord) -> bool:
    """The trial has run (for ``max_concurrent_trials``, it counts until it ends)."""
    return rec.num_results > 0 or rec.restore is not None or rec.trial.status != TrialStatus.PENDING


class TrialIndex:
    """Indexes over ``records`` (positions are their places in the list, which only grows)."""

    def __init__(self, records: Sequence[TrialRecord]) -> None:
        self.records = records
        self._position = {rec.trial_id: pos for pos, rec in enumerate(records)}
        self._pending: list[int] = []  # sorted positions
        self._paused: list[int] = []  # sorted positions
        self._live: set[int] = set()
        self._counts: dict[TrialStatus, int] = dict.fromkeys(TrialStatus, 0)
        self._started_live: set[int] = set()
        self._changed: set[int] | None = None  # None: every record (nothing committed yet)
        for pos, rec in enumerate(records):
            self._place(pos, None)
            rec.trial.watch(self._status_changed)

    def add(self, rec: TrialRecord) -> None:
        """A new record, appended to ``records`` (the next commit writes the whole table:
        a delta keeps the table's length)."""
        pos = len(self._position)
        if pos >= len(self.records) or self.records[pos] is not rec:
            raise ValueError(f"{rec.trial_id} must be appended to the records first")
        self._position[rec.trial_id] = pos
        self._place(pos, None)
        rec.trial.watch(self._status_changed)
        self._changed = None

    def close(self) -> None:
        """Stop watching the trials."""
        for rec in self.records:
            rec.trial.watch(None)

    # -- what changed ------------------------------------------------------------
    def _status_changed(self, trial: Trial, old: TrialStatus) -> None:
        self._place(self._position[trial.trial_id], old)

    def touch(self, rec: TrialRecord) -> None:
        """``rec`` changed other than by its status (results, checkpoints, config, ...)."""
        pos = self._position[rec.trial_id]
        if self._changed is not None:
            self._changed.add(pos)
        self._count_started(pos)

    def touch_all(self) -> None:
        """Any record may have changed (a rare, table-wide change)."""
        self._changed = None
        for pos in range(len(self.records)):
            self._count_started(pos)

    def take_changed(self) -> set[int] | None:
        """The positions of the records changed since the last call (None: all of them)."""
        changed, self._changed = self._changed, set()
        return changed

    def _place(self, pos: int, old: TrialStatus | None) -> None:
        status = self.records[pos].trial.status
        if old is not None:
            self._counts[old] -= 1
        self._counts[status] += 1
        if self._changed is not None:
            self._changed.add(pos)
        for was, where in (
            (TrialStatus.PENDING, self._pending),
            (TrialStatus.PAUSED, self._paused),
        ):
            if old == was:
                i = bisect.bisect_left(where, pos)
                if i < len(where) and where[i] == pos:
                    del where[i]
            if status == was:
                bisect.insort(where, pos)
        if status in (TrialStatus.PENDING, TrialStatus.RUNNING, TrialStatus.PAUSED):
            self._live.add(pos)
        else:
            self._live.discard(pos)
        self._count_started(pos)

    def _count_started(self, pos: int) -> None:
        if pos in self._live and started(self.records[pos]):
            self._started_live.add(pos)
        else:
            self._started_live.discard(pos)

    # -- what is asked -----------------------------------------------------------
    @property
    def live(self) -> int:
        """Trials not yet ended (PENDING, RUNNING or PAUSED)."""
        return len(self._live)

    def counts(self) -> dict[TrialStatus, int]:
        """How many trials have each status (those with none are left out)."""
        return {status: n for status, n in self._counts.items() if n}

    def runnable(self, ready: Callable[[str], bool], cap: int | None) -> RunnableTrials:
        """The trials the scheduler may choose now, in record order: PENDING or PAUSED,
        ``ready`` (not waiting out a retry backoff), and with ``cap``
        (``max_concurrent_trials``) only as many unstarted ones as there is room for."""
        return RunnableTrials(self, ready, cap)

    def _runnable(self, ready: Callable[[str], bool], cap: int | None) -> Iterator[Trial]:
        room = None if cap is None else cap - len(self._started_live)
        # the caller consumes this before any status changes again (a choose call)
        for pos in heapq.merge(self._pending, self._paused):
            rec = self.records[pos]
            if not ready(rec.trial_id):
                continue
            if room is not None and not started(rec):
                if room <= 0:
                    continue
                room -= 1
            yield rec.trial


class RunnableTrials(Sequence[Trial]):
    """A lazy sequence of the runnable trials (:meth:`TrialIndex.runnable`): iterating
    stops where the caller stops; indexing or ``len`` lists them all once."""

    def __init__(self, index: TrialIndex, ready: Callable[[str], bool], cap: int | None) -> None:
        self._index, self._ready, self._cap = index, ready, cap
        self._all: list[Trial] | None = None

    def __iter__(self) -> Iterator[Trial]:
        if self._all is not None:
            return iter(self._all)
        return self._index._runnable(self._ready, self._cap)

    def _listed(self) -> list[Trial]:
        if self._all is None:
            self._all = list(self._index._runnable(self._ready, self._cap))
        return self._all

    def __len__(self) -> int:
        return len(self._listed())

    @overload
    def __getitem__(self, i: int) -> Trial: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Trial]: ...
    def __getitem__(self, i: int | slice) -> Trial | Sequence[Trial]:
        return self._listed()[i]

    def __bool__(self) -> bool:
        return next(iter(self), None) is not None
