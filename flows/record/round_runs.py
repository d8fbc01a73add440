"""Each round as a ``round-N`` task run of the ``tune`` flow run, at the round's real times.

The record replays the training's feed (:mod:`popflow.flows.record.run_feed`) and can
start seconds after the training: Prefect's import, a server's first start. Run
through Prefect's task engine, a round's task run took the time the record took
to replay it: in a short PBT run every round was recorded after the training
ended, each as long as its replay, not its round. Here each round's task run is written through
Prefect's client with the times the feed carries: Running when the round began,
Completed (or Failed) when it committed; its lines carry the times they were
said. A round recorded more than :data:`LATE_S` after it ended says so in its
final state's message, and the run's log says when the record started late.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from popflow.flows.console import live_lines
from popflow.flows.console.verbose import DETAIL
from popflow.flows.record.run_feed import Line

#: Seconds after which a round's record says it was written late (and when).
LATE_S = 2.0


def time_ordered_id(at: float) -> uuid.UUID:
    """A UUIDv7 (RFC 9562) for ``at``: its first 48 bits the milliseconds since the epoch,
    as Prefect's own run ids, so the API's newest-first listings find the round among the
    newest runs (a random id sorted it anywhere among thousands).

    >>> a, b = time_ordered_id(1.0), time_ordered_id(2.0)
    >>> a.version, a < b
    (7, True)
    """
    value = (int(at * 1000) & (1 << 48) - 1) << 80 | int.from_bytes(os.urandom(10), "big")
    value = value & ~(0xF << 76) | 0x7 << 76  # the version
    value = value & ~(0x3 << 62) | 0x2 << 62  # the variant
    return uuid.UUID(int=value)


def utc(at: float) -> datetime:
    """``at`` (seconds since the epoch) as Prefect's states want it."""
    return datetime.fromtimestamp(at, tz=UTC)


def log_at(adapter: Any, line: Line) -> None:
    """``line`` to the run logger ``adapter`` (Prefect's, of a flow or task run) with the
    time it was said: the console and the UI's logs show that time, not the record's. A
    line the console showed when said (:mod:`popflow.flows.console.live_lines`) goes to
    the API only: the record can be seconds behind, and the console in time order."""
    log = adapter.logger
    if not log.isEnabledFor(line.level):
        live_lines.claim(line)
        return
    record = live_lines.stamped(log, line, {**adapter.extra, **(DETAIL if line.detail else {})})
    if not live_lines.claim(line):
        log.handle(record)
    elif log.filter(record):
        for handler in live_lines.api_handlers(log):
            if record.levelno >= handler.level:
                handler.handle(record)


@dataclass
class RoundRun:
    """A round's task run as popflow writes it: Prefect's model, the last event sent about
    it (the next follows it), and the logger of its lines."""

    task_run: Any  # prefect.client.schemas.objects.TaskRun
    logger: Any  # prefect.logging.loggers.PrefectLogAdapter
    last_event: Any = None


class RoundRuns:
    """The ``round-N`` task runs of the flow run in this thread's Prefect context.

    Written as Prefect's own task engine writes a task run (a state-change event per
    state, which the server records as the task run's states, each at its event's
    time), but with the states' times the feed carries: the engine's are the time it
    runs at. ``task`` is the ``round`` task (its name and key group the runs in the UI).
    """

    def __init__(self, task: Any) -> None:
        from prefect.context import FlowRunContext

        context = FlowRunContext.get()
        if context is None or context.flow_run is None:
            raise RuntimeError("round task runs are written from inside the tune flow run")
        self.task = task
        self.flow_run = context.flow_run

    def begin(self, round_no: int, at: float) -> RoundRun:
        """Round ``round_no``'s task run, Running since ``at``."""
        from prefect.client.schemas.objects import TaskRun, TaskRunPolicy
        from prefect.context import TagsContext
        from prefect.logging.loggers import task_run_logger
        from prefect.states import Pending, Running

        run_id = time_ordered_id(at)
        pending = Pending(timestamp=utc(at))
        task_run = TaskRun(
            id=run_id,
            name=f"round-{round_no}",
            flow_run_id=self.flow_run.id,
            task_key=self.task.task_key,
            dynamic_key=str(run_id),  # a flow run's retry replays its rounds: keys of their own
            empirical_policy=TaskRunPolicy(),
            tags=sorted(TagsContext.get().current_tags or []),
            expected_start_time=pending.timestamp,
            flow_run_run_count=self.flow_run.run_count,
            state=pending,
            created=pending.timestamp,
            updated=pending.timestamp,
        )
        run = RoundRun(task_run, task_run_logger(task_run, task=self.task, flow_run=self.flow_run))
        self._set(run, pending)
        running = Running(timestamp=utc(at) + timedelta(microseconds=1))
        task_run.start_time = running.timestamp
        self._set(run, running)
        return run

    def end(self, run: RoundRun, at: float, error: BaseException | None = None) -> None:
        """``run`` Completed at ``at``; Failed with ``error`` (an Exception), or Crashed
        (an interrupt)."""
        from prefect.states import Completed, Crashed, Failed

        note = _late(at)
        stamp = max(utc(at), run.task_run.state.timestamp + timedelta(microseconds=1))
        if error is None:
            state = Completed(timestamp=stamp, message=note or None)
        elif isinstance(error, Exception):
            said = f"{type(error).__name__}: {error}"
            state = Failed(timestamp=stamp, message=f"{said}; {note}" if note else said)
        else:
            state = Crashed(timestamp=stamp, message=f"interrupted ({type(error).__name__})")
        run.task_run.end_time = stamp
        self._set(run, state)

    def _set(self, run: RoundRun, state: Any) -> None:
        """``state`` as ``run``'s, told to Prefect as its engine tells it (an event)."""
        from prefect.utilities.engine import emit_task_run_state_change_event

        task_run = run.task_run
        last = task_run.state
        state.state_details.task_run_id = task_run.id
        state.state_details.flow_run_id = task_run.flow_run_id
        if last.is_running():
            task_run.total_run_time += state.timestamp - last.timestamp
        if state.is_running():
            task_run.run_count += 1
        task_run.state = state
        task_run.state_id, task_run.state_type, task_run.state_name = (
            state.id,
            state.type,
            state.name,
        )
        run.last_event = emit_task_run_state_change_event(
            task_run=task_run,
            initial_state=None if last is state else last,
            validated_state=state,
            follows=run.last_event,
        )


def _late(at: float) -> str:
    """What a round's record says when written :data:`LATE_S` or more after ``at``."""
    lag = time.time() - at
    return f"recorded {lag:.1f} s after the round ended" if lag >= LATE_S else ""


def late_start_line(first_round_at: float) -> Line:
    """The run log's line when its record (the flow run) starts after the run's first
    round began, at ``first_round_at``: no server answered when the run began."""
    lag = max(0.0, time.time() - first_round_at)
    return Line(
        logging.INFO,
        f"this record started {lag:.1f} s after the run's first round (no Prefect server "
        "answered yet: it was starting); its rounds and lines carry the times they happened",
        detail=True,  # for the UI, where the times are read; the console said it all live
    )
