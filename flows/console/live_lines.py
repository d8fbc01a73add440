"""The run's lines on the console when they are said, not when its Prefect record gets to them.

A run's lines (its start, rounds, errors, end: :class:`~popflow.flows.record.run_feed.Line`)
go from the training thread through the feed to the Prefect record's thread, which logs
them to the run's Prefect logger at the time they were said
(:func:`~popflow.flows.record.round_runs.log_at`). That record can be seconds behind (a
server's first start, a slow API), while popflow's module loggers print at once: the
console showed lines out of time order. So the training thread prints each line to the
console's handlers (every handler of the run logger's hierarchy but Prefect's API
handlers) as the record would, in the same format, and the record sends it to the API
only (:func:`claim`).

Lines are printed live once a record has set the console up (Prefect's logging and the
run's verbosity, :func:`~popflow.flows.console.verbose.console_verbosity`): the ones said
before wait, in order, and print then, or the record prints them as it always did.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from popflow.flows.console.verbose import DETAIL

if TYPE_CHECKING:
    from popflow.flows.record.run_feed import Line, RunFeed

_lock = threading.Lock()
#: the feeds whose record set the console up, by id
_ready: dict[int, RunFeed] = {}
#: lines said before their feed's console was set, in order: (feed, line, round)
_waiting: list[tuple[RunFeed, Line, int | None]] = []
#: the ids of lines printed live and not yet claimed by their record (a line is alive
#: until then: it is in its feed's queue, so its id is its own)
_shown: set[int] = set()


@contextmanager
def live(feed: RunFeed) -> Iterator[None]:
    """Within: ``feed``'s record has set the console up (Prefect's logging, the run's
    verbosity): its lines print when said."""
    with _lock:
        _ready[id(feed)] = feed
        _flush()
    try:
        yield
    finally:
        with _lock:
            _ready.pop(id(feed), None)


def say(feed: RunFeed, line: Line, round_no: int | None) -> None:
    """``line`` of ``feed`` (of round ``round_no``'s task run, None: the flow run's) to the
    console now, or as soon as its console is set."""
    with _lock:
        _waiting.append((feed, line, round_no))
        _flush()


def claim(line: Line) -> bool:
    """For the record, about to log ``line``: True if the console showed it (the record
    sends it to the API only); else it is the record's to print, never printed here."""
    with _lock:
        if id(line) in _shown:
            _shown.discard(id(line))
            return True
        for i, (_, waiting, _) in enumerate(_waiting):
            if waiting is line:
                del _waiting[i]
                break
        return False


def _flush() -> None:
    """The waiting lines to the console, each feed's in order, once its console is set and
    its flow run named (the name is in each line's format); under :data:`_lock`."""
    held: set[int] = set()  # feeds with a line that waits: their later lines wait too
    kept: list[tuple[RunFeed, Line, int | None]] = []
    for feed, line, round_no in _waiting:
        if id(feed) in held or id(feed) not in _ready or not feed.title:
            held.add(id(feed))
            kept.append((feed, line, round_no))
            continue
        _print(line, feed.title, round_no)
        _shown.add(id(line))
    _waiting[:] = kept


def _print(line: Line, flow_run: str, round_no: int | None) -> None:
    """``line`` to the console's handlers as Prefect's run logger would log it."""
    if round_no is None:
        log = logging.getLogger("prefect.flow_runs")
        extra: dict[str, Any] = {"flow_run_name": flow_run, "flow_name": "tune"}
    else:
        log = logging.getLogger("prefect.task_runs")
        extra = {"task_run_name": f"round-{round_no}", "task_name": "round"}
        extra |= {"flow_run_name": flow_run, "flow_name": "tune"}
    if not log.isEnabledFor(line.level):
        return
    record = stamped(log, line, extra | (DETAIL if line.detail else {}))
    if not log.filter(record):
        return
    for handler in console_handlers(log):
        if record.levelno >= handler.level:
            handler.handle(record)


def stamped(log: logging.Logger, line: Line, extra: dict[str, Any]) -> logging.LogRecord:
    """``line`` as a record of ``log``, stamped with the time it was said."""
    record = log.makeRecord(log.name, line.level, __file__, 0, line.message, (), None, None, extra)
    record.created = line.at
    record.msecs = (line.at - int(line.at)) * 1000
    return record


def _handlers(log: logging.Logger) -> Iterator[logging.Handler]:
    """The handlers a record of ``log`` reaches (``logging.Logger.callHandlers``' walk)."""
    current: logging.Logger | None = log
    while current is not None:
        yield from current.handlers
        current = current.parent if current.propagate else None


def _is_api(handler: logging.Handler) -> bool:
    from prefect.logging.handlers import APILogHandler

    return isinstance(handler, APILogHandler)


def console_handlers(log: logging.Logger) -> list[logging.Handler]:
    """What prints ``log``'s records here: all its handlers but Prefect's API ones."""
    return [h for h in _handlers(log) if not _is_api(h)]


def api_handlers(log: logging.Logger) -> list[logging.Handler]:
    """What sends ``log``'s records to the Prefect API."""
    return [h for h in _handlers(log) if _is_api(h)]
