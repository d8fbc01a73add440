"""What a run's training tells its Prefect record, in order.

``popflow.run`` trains in the calling thread and tells Prefect from a thread of its
own: storage, not Prefect, is the truth. Prefect's import and the flow run's creation
overlap the cluster's start, and the first round waits for the flow run to be Running
when a server answers (:meth:`RunFeed.wait_for_record`: at once where the record made
it before Prefect's import, :mod:`popflow.flows.record.early_run`); a server that must start first
(the embedded default's first run) is not waited for: the record catches up. The training puts events on a
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

from popflow.flows.console import live_lines
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
    #: the ``tune`` flow run's name: the experiment's, and the round a resume continues
    #: after (set before :attr:`titled`)
    title: str = ""
    #: set once :attr:`title` is known (the experiment opened) or the training ended: the
    #: record creates the flow run under that name
    titled: threading.Event = field(default_factory=threading.Event)
    #: set by the record once the ``tune`` flow run is Running, or once it knows it will
    #: be late (no server answers yet) or failed: the first round waits for it
    #: (:meth:`wait_for_record`), so the flow run holds every round
    record_ready: threading.Event = field(default_factory=threading.Event)
    #: the ``tune`` flow run made Running before Prefect's import
    #: (:class:`~popflow.flows.record.early_run.EarlyRun`; None: Prefect's engine makes it)
    early_run: Any = None
    #: when the first round began (None: not yet): a record that starts after it says so
    first_round_at: float | None = None
    #: the round begun and not yet done: the task run a line said now belongs to
    open_round: int | None = None

    def name(self, title: str) -> None:
        """The flow run's name, from the opened experiment."""
        self.title = title
        self.titled.set()

    def wait_for_record(self, timeout_s: float) -> bool:
        """Before the first round: wait up to ``timeout_s`` for the flow run to be Running
        (at once if the record will be late anyway); whether it is ready."""
        return self.record_ready.wait(timeout_s)

    #: a stop asked from Prefect (a cancel, seen by the record): the driver ends at it
    stop: StopAsked = field(default_factory=StopAsked)

    def line(self, level: int, message: str, detail: bool = False) -> None:
        line = Line(level, message, detail)
        live_lines.say(self, line, self.open_round)  # the console, now: its time order
        self._queue.put(line)

    def round_begins(self, round_no: int, at: float | None = None) -> None:
        """Round ``round_no`` begins (``at``: when it began, if before now)."""
        event = RoundBegins(round_no) if at is None else RoundBegins(round_no, at)
        if self.first_round_at is None:
            self.first_round_at = event.at
        self.open_round = round_no
        self._queue.put(event)

    def round_done(
        self,
        round_no: int,
        lines: list[Line],
        rows: list[dict[str, Any]],
        done: float,
        progress: str = "",
    ) -> None:
        for line in lines:
            live_lines.say(self, line, round_no)
        self.open_round = None
        self._queue.put(RoundDone(round_no, lines, rows, done, progress))

    def resumed(self, experiment: str, epoch: int) -> None:
        self._queue.put(Resumed(experiment, epoch))

    def notice(self, event: str, payload: dict[str, Any]) -> None:
        self._queue.put(Notice(event, payload))

    def end(self, event: RunEnd) -> None:
        self.titled.set()  # a run that ended before its experiment opened: its own name
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
