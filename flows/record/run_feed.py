"""What a run's training tells its Prefect record, in order: the record catches up.

``popflow.run`` trains at once, in the calling thread, and tells Prefect
afterwards: importing Prefect and starting its server take seconds, and
storage, not Prefect, is the truth. The training puts events on a
:class:`RunFeed`; the ``tune`` flow (:mod:`popflow.flows.record.prefect_flow`) runs
in a thread of its own and turns each into what the Prefect UI shows: a log
line of the run, a ``round-N`` task run with the lines of that round, the
artifacts, the run's end. A line logged while a round runs belongs to that
round's task run, which is Running in the UI while the round is (once the
record has caught up).

Every event carries the time it happened (``at``, seconds since the epoch): the
record can start seconds after the training (Prefect's import, its server's first
start), and what the UI shows of a round or a line is when it happened, not when
the record got to it.

In the training thread :func:`popflow.flows.record.run_log.run_logger` is the feed's
:class:`FeedLogger`, so the code that logs for the UI does not change.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from popflow.flows.driver.early_end import StopAsked

#: The feed of the run this thread trains (None: not a training thread).
CURRENT: contextvars.ContextVar[RunFeed | None] = contextvars.ContextVar(
    "popflow_run_feed", default=None
)


@dataclass(frozen=True)
class Line:
    """A line for the run's log: ``detail`` lines reach the console at ``verbose=3`` only."""

    level: int
    message: str
    detail: bool = False
    at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class RoundBegins:
    """Round ``round_no`` starts: the lines after it belong to its task run."""

    round_no: int
    at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class RoundDone:
    """The round committed: its summary and decisions; the leaderboard's rows and the
    share of trials ended, for the artifacts."""

    round_no: int
    lines: list[Line]
    rows: list[dict[str, Any]]
    done_percent: float
    progress: str = ""  # trials ended and the best result so far, in words
    at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class Resumed:
    """The experiment resumed under driver ``epoch``: earlier drivers' runs are stale."""

    experiment: str
    epoch: int


@dataclass(frozen=True)
class RunEnd:
    """The training ended: with ``grid`` and ``message`` (the final state's) and the
    summary artifact's text, or with ``error``."""

    message: str = ""
    grid: Any = None
    summary: str | None = None
    error: BaseException | None = None
    at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class Notice:
    """A Prefect event for automations (``popflow.round.committed``...): its name and
    payload (:mod:`popflow.flows.record.prefect_events`)."""

    event: str
    payload: dict[str, Any]
    at: float = field(default_factory=time.time)


@dataclass
class RunFeed:
    """A queue of :class:`Line`, :class:`RoundBegins`, :class:`RoundDone`,
    :class:`Resumed` and :class:`RunEnd` events, from the training thread to the
    record's."""

    _queue: queue.SimpleQueue[Any] = field(default_factory=queue.SimpleQueue)
    finished: bool = False  # the RunEnd was taken
    #: when the run began (its ``popflow.run`` call): how late the record starts
    started_at: float = field(default_factory=time.time)
    #: the ``tune`` flow run's name: the experiment's, and the round a resume continues
    #: after (set before :attr:`training`)
    title: str = ""
    #: set once the cluster is up (or the training ended): the record's work (Prefect's
    #: import, its server) waits for it, so as not to slow the workers' start
    training: threading.Event = field(default_factory=threading.Event)
    #: a stop asked from Prefect (a cancel, seen by the record): the driver ends at it
    stop: StopAsked = field(default_factory=StopAsked)

    def line(self, level: int, message: str, detail: bool = False) -> None:
        self._queue.put(Line(level, message, detail))

    def round_begins(self, round_no: int, at: float | None = None) -> None:
        """Round ``round_no`` begins (``at``: when it began, if before now)."""
        self._queue.put(RoundBegins(round_no) if at is None else RoundBegins(round_no, at))

    def round_done(
        self,
        round_no: int,
        lines: list[Line],
        rows: list[dict[str, Any]],
        done: float,
        progress: str = "",
    ) -> None:
        self._queue.put(RoundDone(round_no, lines, rows, done, progress))

    def resumed(self, experiment: str, epoch: int) -> None:
        self._queue.put(Resumed(experiment, epoch))

    def notice(self, event: str, payload: dict[str, Any]) -> None:
        self._queue.put(Notice(event, payload))

    def end(self, event: RunEnd) -> None:
        self.training.set()
        self._queue.put(event)

    def next(self) -> Any:
        """The next event, waited for; None after the :class:`RunEnd` was taken."""
        if self.finished:
            return None
        event = self._queue.get()
        if isinstance(event, RunEnd):
            self.finished = True
        return event


class FeedLogger:
    """A logger whose lines go to a :class:`RunFeed` (``logging.Logger``'s calls)."""

    def __init__(self, feed: RunFeed) -> None:
        self.feed = feed

    def log(self, level: int, msg: str, *args: Any, extra: Any = None, **_: Any) -> None:
        detail = bool(extra and extra.get("popflow_detail"))
        self.feed.line(level, msg % args if args else msg, detail)

    def debug(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.log(logging.DEBUG, msg, *args, **kwargs)

    def info(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.log(logging.INFO, msg, *args, **kwargs)

    def warning(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.log(logging.WARNING, msg, *args, **kwargs)

    def error(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.log(logging.ERROR, msg, *args, **kwargs)
