"""The console's log lines in time order (issue 43, item 9): a run's own lines print when
said, not when its Prefect record (seconds behind while a server starts) gets to them."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

import pytest
from prefect.logging.handlers import PrefectConsoleHandler
from support.parity import sleepy_run

from popflow.flows.api import training
from popflow.flows.console import live_lines
from popflow.flows.record import prefect_flow, run_feed
from popflow.flows.record.run_feed import RunEnd, RunFeed


class Stamped(logging.Handler):
    """The records a console handler gets, in the order it gets them."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def stamped(*names: str) -> Iterator[Stamped]:
    handler = Stamped()
    for name in names:
        logging.getLogger(name).addHandler(handler)
    try:
        yield handler
    finally:
        for name in names:
            logging.getLogger(name).removeHandler(handler)


@pytest.mark.integration
def test_a_late_record_leaves_the_console_in_time_order(tune_env, monkeypatch):
    """The record's API held back until the training ended (as while a first run's Prefect
    server starts): the run's lines (its start, each round's summary) and popflow's module
    lines reach the console's handlers in the order they were said, each once. Before, the
    run's lines came when the record replayed them, after the training: seconds late."""
    ended = threading.Event()
    real_end, real_api = run_feed.RunFeed.end, prefect_flow.prefect_api

    def end(feed: RunFeed, event: RunEnd) -> None:
        real_end(feed, event)
        ended.set()

    @contextlib.contextmanager
    def late_api() -> Iterator[None]:
        assert ended.wait(timeout=300)
        with real_api():
            yield

    monkeypatch.setattr(run_feed.RunFeed, "end", end)
    monkeypatch.setattr(prefect_flow, "prefect_api", late_api)
    monkeypatch.setattr(training, "RECORD_WAIT_S", 0.0)  # as for a server that must start
    console = Stamped()
    printed = PrefectConsoleHandler.emit

    def emit(handler: PrefectConsoleHandler, record: logging.LogRecord) -> None:
        console.emit(record)
        printed(handler, record)

    # what Prefect's console handler prints (its setup replaces any handler of a test's)
    monkeypatch.setattr(PrefectConsoleHandler, "emit", emit)
    sleepy_run("console-order", 0.3, verbose=3, **tune_env)
    ours = [
        r
        for r in console.records
        if r.name.startswith("popflow") or r.name in ("prefect.flow_runs", "prefect.task_runs")
    ]
    said = [r.getMessage() for r in ours]
    assert sum(m.startswith("console-order: 2 trials; results in ") for m in said) == 1, said
    for n in (1, 2, 3):
        assert sum(m.startswith(f"round {n} committed: ") for m in said) == 1, said
    latest = 0.0
    for record in ours:
        # threads stamp, then print: a few milliseconds apart at most, not the record's lag
        assert record.created >= latest - 0.5, (record.getMessage(), latest - record.created)
        latest = max(latest, record.created)
    rounds = [r for r in ours if r.getMessage().startswith("round ")]
    assert [getattr(r, "task_run_name", None) for r in rounds] == ["round-1", "round-2", "round-3"]


@pytest.mark.unit
def test_a_line_prints_once_when_its_console_is_set():
    """A line said before its record set the console up waits, and prints then (named by
    its flow run), in order; the record then sends it to the API only. A line the record
    took first is never printed here."""
    feed = RunFeed()
    first, second = run_feed.Line(logging.INFO, "first"), run_feed.Line(logging.INFO, "second")
    taken = run_feed.Line(logging.INFO, "taken")
    prefect = logging.getLogger("prefect")
    old = prefect.level
    prefect.setLevel(logging.INFO)  # as Prefect's logging sets it
    with contextlib.ExitStack() as undo, stamped("prefect") as console:
        undo.callback(prefect.setLevel, old)
        live_lines.say(feed, taken, None)
        assert not live_lines.claim(taken)  # the record's to print
        live_lines.say(feed, first, None)
        with live_lines.live(feed):
            assert console.records == []  # its flow run has no name yet
            feed.name("order")
            live_lines.say(feed, second, 2)
        assert [r.getMessage() for r in console.records] == ["first", "second"]
        assert [getattr(r, "task_run_name", None) for r in console.records] == [None, "round-2"]
        assert {getattr(r, "flow_run_name", None) for r in console.records} == {"order"}
        assert [live_lines.claim(line) for line in (first, second, taken)] == [True, True, False]
        after = run_feed.Line(logging.INFO, "after")
        live_lines.say(feed, after, None)  # its record ended: the record prints it
        assert len(console.records) == 2
        assert not live_lines.claim(after)
