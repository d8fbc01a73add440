"""The ``tune`` flow run made Running before Prefect's import (``flows/record/early_run.py``).

Where the server is known without Prefect (``PREFECT_API_URL``, as these tests set it),
the record makes its flow run with two plain requests and the engine adopts it: the
first round does not wait for Prefect's import, and the run still holds every round.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any
from urllib.parse import urlparse

import pytest
from support.parity import sleepy_run
from support.prefect_api import api, run_logs, tune_runs
from test_prefect_record import _round_task_runs
from test_resume import ListHandler

from popflow.flows.record import early_run, prefect_flow, run_feed

pytestmark = pytest.mark.integration


def _held_import(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Prefect's objects held back until the run's first round began (an import that
    takes longer than the cluster's start); the event is set when it began."""
    began = threading.Event()
    real_begins, real_objects = run_feed.RunFeed.round_begins, prefect_flow.prefect_objects

    def round_begins(feed: run_feed.RunFeed, round_no: int, at: float | None = None) -> None:
        began.set()
        real_begins(feed, round_no, at)

    def held_objects() -> Any:
        began.wait(timeout=60)
        return real_objects()

    monkeypatch.setattr(run_feed.RunFeed, "round_begins", round_begins)
    monkeypatch.setattr(prefect_flow, "prefect_objects", held_objects)
    return began


def test_the_first_round_does_not_wait_for_prefects_import(tune_env, monkeypatch):
    """Prefect's import still under way when the cluster is up: round 1 starts at once, in
    a flow run already Running, which the engine then adopts (one run, run count 1, no
    "started late" line). Before, round 1 waited for the import and the flow run's
    creation (up to ``RECORD_WAIT_S``, here forever: the import waited for round 1)."""
    began = _held_import(monkeypatch)
    sleepy_run("early-run", 0.1, **tune_env)
    assert began.is_set()
    (flow_run,) = tune_runs("early-run")
    rounds = _round_task_runs("early-run", 3)
    assert [t.name for t in rounds] == ["round-1", "round-2", "round-3"]
    assert flow_run.start_time <= rounds[0].start_time, (flow_run.start_time, rounds[0])
    assert flow_run.end_time >= rounds[-1].end_time
    assert flow_run.state.is_completed() and flow_run.run_count == 1
    assert "experiment:early-run" in flow_run.tags
    assert flow_run.parameters["spec"]["storage"].endswith("early-run")
    said = run_logs("early-run")
    assert not any(m.startswith("this record started ") for m in said), said


def test_a_record_that_fails_before_adopting_its_run_ends_it_crashed(tune_env, monkeypatch):
    """No flow run stays Running when the record fails after making it: Crashed, with
    the record's error; the training itself finishes."""

    def broken_objects() -> Any:
        raise ImportError("prefect.flow_engine: a broken install")

    monkeypatch.setattr(prefect_flow, "prefect_objects", broken_objects)
    grid = sleepy_run("early-crash", 0.0, **tune_env)
    assert not grid.errors and len(grid) == 2
    (flow_run,) = tune_runs("early-crash")
    assert flow_run.state.type.value == "CRASHED", flow_run.state
    assert "a broken install" in flow_run.state.message


def test_a_run_made_on_another_server_than_prefects_settings_name_is_withdrawn(
    tune_env, monkeypatch
):
    """A profile (or ``prefect.toml``) may name another API than the environment popflow
    read: the run made early is deleted and Prefect's engine makes the record's run, so
    the experiment has one ``tune`` run, not an orphan Running beside it."""
    made: list[early_run.EarlyRun] = []
    real_create = early_run.EarlyRun.create.__func__

    def create(cls: type[early_run.EarlyRun], *args: Any) -> early_run.EarlyRun | None:
        early = real_create(cls, *args)
        made.append(early)
        return early

    monkeypatch.setattr(early_run.EarlyRun, "create", classmethod(create))
    monkeypatch.setattr(early_run.EarlyRun, "serves", lambda self, url: False)
    sleepy_run("early-elsewhere", 0.0, **tune_env)
    (early,) = made
    (flow_run,) = tune_runs("early-elsewhere")
    assert str(flow_run.id) != early.id and flow_run.state.is_completed()
    from prefect.exceptions import ObjectNotFound

    with pytest.raises(ObjectNotFound):
        api(lambda client: client.read_flow_run(early.id))


def test_the_runs_first_lines_print_before_the_engine_adopts_it(tune_env, monkeypatch):
    """The engine adopts the run only once Prefect is imported: for a run shorter than the
    import, its "Beginning flow run" and "View at" lines printed after the results (issue
    43's adversarial pass). The record says them when it makes the run, in the console's
    order, and the engine's own are not printed again."""
    ended = threading.Event()
    real_end, real_adopt = run_feed.RunFeed.end, prefect_flow.adopt
    console = ListHandler()  # what the console's handlers get of the flow run's lines
    before: list[str] = []  # ... before the engine adopted the run

    def end(feed: run_feed.RunFeed, event: run_feed.RunEnd) -> None:
        real_end(feed, event)
        ended.set()

    def late_adopt(*args: Any) -> Any:
        assert ended.wait(timeout=300)  # the engine adopts the run after the training
        before.extend(console.lines)
        return real_adopt(*args)

    monkeypatch.setattr(run_feed.RunFeed, "end", end)
    monkeypatch.setattr(prefect_flow, "adopt", late_adopt)
    from prefect.logging.configuration import setup_logging
    from prefect.logging.handlers import PrefectConsoleHandler

    # Prefect's logging set up first, as the run's record would (its set-up replaces the
    # handlers of prefect.flow_runs, this test's among them)
    if not any(isinstance(h, PrefectConsoleHandler) for h in logging.getLogger().handlers):
        setup_logging()
    runs_logger = logging.getLogger("prefect.flow_runs")
    runs_logger.addHandler(console)
    try:
        sleepy_run("early-lines", 0.0, verbose=1, **tune_env)
    finally:
        runs_logger.removeHandler(console)
    (flow_run,) = tune_runs("early-lines")
    port = urlparse(os.environ["PREFECT_API_URL"]).port
    view = f"View at http://127.0.0.1:{port}/runs/flow-run/{flow_run.id}"
    begin = "Beginning flow run 'early-lines' for flow 'tune'"
    assert begin in before and view in before, before
    assert before.index(begin) + 1 == before.index(view), before
    firsts = [m for m in console.lines if m.startswith(("View at ", "Beginning flow run"))]
    assert firsts == [begin, view], console.lines  # the engine's own: not printed
