"""On resume: every earlier attempt of the experiment in Prefect, with the rounds it committed.

The Prefect record of a run trails its training (it runs in a thread of its own), so a
driver killed with ``kill -9`` leaves its ``tune`` flow run short of the rounds it
committed, or leaves none at all when it died before its record started (Prefect
being slow to import or to answer). Storage holds the truth: each commit keeps the
recent rounds of every driver epoch with their times
(:mod:`popflow.flows.experiment.round_history`). The driver that resumes reads them and,
for each earlier epoch:

- finds its ``tune`` flow run (one of its ``round-N`` task runs started when that
  round began; else, one of that attempt's title that no other attempt claims);
- writes each round it committed that the record never wrote as a ``round-N`` task
  run at its real times (Completed), and the round it was in when it stopped as
  Crashed, until its last sign of life (its last commit, or its lease's last renewal);
  a round task run its record left Running ends the same way: Completed at its commit,
  or Crashed when the driver was last seen (never at the takeover: the UI would show
  two attempts in one round at once);
- when there is no flow run, creates one (the title the attempt would have had, the
  tags of this run), with those rounds, and ends it Crashed (Completed, for a driver
  that released its lease: it ran to its end while Prefect was away). The API gives a flow
  run's states the server's time: its start and end are when it was written, and its
  message says when the attempt really ran.

Its Crashed states are named "Superseded", as :mod:`popflow.flows.record.stale_runs`'s:
their event is not the ``prefect.flow-run.Crashed`` that the re-run automation answers.
Idempotent: a round already in the flow run (at its start time) is not written again,
and a created flow run is found by its rounds (or its title) the next time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from popflow.flows.experiment.round_history import KEY, Attempt, Round, attempts
from popflow.flows.record.flow_parameters import runs_experiment
from popflow.flows.record.round_runs import RoundRun, RoundRuns, utc

logger = logging.getLogger(__name__)

#: Seconds between a round's start in storage and its task run's (the record adds 1 µs).
SAME_S = 0.005
#: Seconds around an attempt's life within which a flow run of its title, with none of its
#: rounds, was made by it (its record starts before its first round, or lags behind it).
NEAR_S = 300.0
#: How many runs and task runs one API call reads.
PAGE = 200
#: The state name of an earlier attempt that ended Crashed (see the module's doc).
STOPPED = "Superseded"


@dataclass
class Found:
    """A ``tune`` flow run of the experiment and its round task runs (name, start, state)."""

    run: Any  # prefect.client.schemas.objects.FlowRun
    rounds: list[tuple[str, datetime | None, str | None]] = field(default_factory=list)

    def has(self, no: int, began: float | None, after: float | None = None) -> bool:
        """Whether round ``no`` is in it: started at ``began`` (None: any time after ``after``)."""
        for name, start, _ in self.rounds:
            if name != f"round-{no}" or start is None:
                continue
            at = start.timestamp()
            if began is not None and abs(at - began) <= SAME_S:
                return True
            if began is None and (after is None or at >= after - SAME_S):
                return True
        return False

    def claims(self, attempt: Attempt) -> bool:
        """One of its rounds is the attempt's: a committed one, or the round it was in as
        :func:`_backfill` writes it (from its last commit on)."""
        last = attempt.last
        return self.has(last.no + 1, last.at) or any(
            self.has(r.no, r.began) for r in attempt.rounds if r.began is not None
        )


def experiment_history(storage: Any) -> list[Attempt]:
    """The attempts the newest commit of the experiment at ``storage`` lists."""
    from popflow.infra.store.commit_log import ExperimentLog

    latest = ExperimentLog(storage).latest() or {}
    return attempts(latest.get(KEY))


def last_sign_of_life(storage: Any, epoch: int, attempt: Attempt) -> tuple[float, bool]:
    """When the driver of ``epoch`` was last seen (its lease file's last write, a renewal or
    its release, if the file is still there; else its last commit), and whether it released
    its lease (it ended, not killed)."""
    from popflow.infra.store.layout import lease_path
    from popflow.infra.store.lease_files import read_lease

    seen = attempt.last.at
    try:
        lease = read_lease(storage, epoch, 60.0, time.time()) or {}
        if lease:
            seen = max(seen, storage.modified(lease_path(epoch)))
    except Exception:  # pruned or unreadable: the commits tell the rest
        lease = {}
    return seen, bool(lease.get("released"))


def title_of(experiment: str, attempt: Attempt) -> str:
    """The flow run name the attempt's record had (or would have had)."""
    if attempt.fresh:
        return experiment
    return f"{experiment} · resumed after round {attempt.first - 1}"


def record_attempts(
    client: Any,
    experiment: str,
    storage: Any,
    epoch: int,
    current: UUID,
    tags: list[str],
    objects: Any,
    left: Sequence[Any] = (),
) -> tuple[int, set[Any]]:
    """Every attempt of ``experiment`` before driver ``epoch`` (this one, whose flow run is
    ``current``) in Prefect, as the module's doc says; how many flow runs were written,
    and the ids of the task runs of ``left`` (round task runs earlier records left
    Running) it ended Crashed at their attempt's last sign of life. ``objects``: the
    ``tune`` flow and its ``round`` task
    (:func:`~popflow.flows.record.prefect_flow.prefect_objects`)."""
    ended: set[Any] = set()
    earlier = [a for a in experiment_history(storage) if a.epoch < epoch]
    if not earlier:
        return 0, ended
    found = _tune_runs(client, experiment, storage.url)
    # a run with a round of an attempt is that attempt's (a re-run flow run: of several)
    taken = {f.run.id for f in found for a in earlier if f.claims(a)} | {current}
    written = 0
    for attempt in earlier:
        seen, released = last_sign_of_life(storage, attempt.epoch, attempt)
        match = next((f for f in found if f.claims(attempt)), None)
        if match is None:  # one of its title that no other attempt has, made while it ran
            title = title_of(experiment, attempt)
            match = next(
                (
                    f
                    for f in found
                    if f.run.name == title
                    and f.run.id not in taken
                    and attempt.since - NEAR_S <= f.run.created.timestamp() <= seen + NEAR_S
                ),
                None,
            )
        said = _said(experiment, attempt, seen, current, epoch, released)
        if match is None:
            match = Found(
                _create(client, objects.tune_flow, experiment, attempt, tags, said, released)
            )
            found.append(match)
            written += 1
        taken.add(match.run.id)
        stopped = not released and (match.run.id == current or not _ended_itself(match.run))
        written += _backfill(client, objects.round_task, match, attempt, seen, stopped, said)
        ended |= _end_left(objects.round_task, match.run, left, attempt, seen, stopped, said)
        if match.run.id != current and not _final(match.run):
            from prefect.states import Completed, Crashed

            end = Completed(message=said) if released else Crashed(name=STOPPED, message=said)
            client.set_flow_run_state(match.run.id, end, force=True)
    return written, ended


def _said(
    experiment: str, attempt: Attempt, seen: float, current: UUID, epoch: int, released: bool
) -> str:
    """The earlier attempt's final state message: what it did, when, and who went on."""
    rounds = attempt.rounds
    span = (
        "no round"
        if not rounds
        else f"round {rounds[0].no}"
        if len(rounds) == 1
        else f"rounds {rounds[0].no}-{rounds[-1].no}"
    )
    how = "ended (it released its lease)" if released else "killed or stopped"
    return (
        f"{how}: driver epoch {attempt.epoch} of {experiment!r} committed {span} "
        f"(from {utc(attempt.since).isoformat()}), last seen {utc(seen).isoformat()}; "
        f"resumed by flow run {current} (driver epoch {epoch})"
    )


def _tune_runs(client: Any, experiment: str, url: str) -> list[Found]:
    """The ``tune`` flow runs (oldest first) of the experiment ``experiment`` at ``url``,
    with their round task runs."""
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterTags,
        TaskRunFilter,
        TaskRunFilterFlowRunId,
    )
    from prefect.client.schemas.sorting import FlowRunSort

    runs: list[Any] = []
    while True:
        page = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["tune"])),
            flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[f"experiment:{experiment}"])
            ),
            sort=FlowRunSort.EXPECTED_START_TIME_ASC,
            limit=PAGE,
            offset=len(runs),
        )
        runs += page
        if len(page) < PAGE:
            break
    found = {r.id: Found(r) for r in runs if runs_experiment(r.parameters, experiment, url)}
    for ids in (list(found)[i : i + 20] for i in range(0, len(found), 20)):
        offset = 0
        while True:
            page = client.read_task_runs(
                task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=ids)),
                limit=PAGE,
                offset=offset,
            )
            for task in page:
                if task.flow_run_id in found:
                    found[task.flow_run_id].rounds.append(
                        (task.name, task.start_time, task.state_name)
                    )
            offset += len(page)
            if len(page) < PAGE:
                break
    return list(found.values())


def _final(run: Any) -> bool:
    return run.state is not None and run.state.is_final()


def _ended_itself(run: Any) -> bool:
    """The flow run ended as a run ends (Completed, Failed, Cancelled), not Crashed."""
    return _final(run) and not run.state.is_crashed()


def _create(
    client: Any,
    tune_flow: Any,
    experiment: str,
    attempt: Attempt,
    tags: list[str],
    said: str,
    released: bool,
) -> Any:
    """A flow run for an attempt whose record never started: Running, its rounds to come."""
    from prefect.states import Pending, Running

    run = client.create_flow_run(
        tune_flow,
        name=title_of(experiment, attempt),
        parameters={"name": experiment},
        tags=tags,
        state=Pending(message="recorded from storage by a later driver: " + said),
    )
    client.set_flow_run_state(run.id, Running(message=said), force=True)
    logger.info(
        "%s: driver epoch %d had no Prefect record (%s); wrote one from storage",
        experiment,
        attempt.epoch,
        "it ended while Prefect was unreachable" if released else "killed before it started",
    )
    return client.read_flow_run(run.id)


def _backfill(
    client: Any,
    round_task: Any,
    found: Found,
    attempt: Attempt,
    seen: float,
    stopped: bool,
    said: str,
) -> int:
    """The rounds of ``attempt`` missing from ``found``'s flow run, at their times; the
    round it was in when ``stopped``, Crashed until ``seen``. How many it wrote."""
    writer = PastRounds(round_task, found.run)
    wrote = 0
    for r in attempt.rounds:
        if r.began is None or found.has(r.no, r.began):
            continue  # a round whose start was not committed is not placed
        writer.end(writer.begin(r.no, r.began), r.at)
        found.rounds.append((f"round-{r.no}", utc(r.began), "Completed"))
        wrote += 1
    last = attempt.last
    if stopped and not found.has(last.no + 1, None, after=last.at):
        begun = writer.begin(last.no + 1, last.at)
        writer.crash(begun, max(seen, last.at), said)
        found.rounds.append((f"round-{last.no + 1}", utc(last.at), STOPPED))
        wrote += 1
    return wrote


def _end_left(
    round_task: Any,
    run: Any,
    left: Sequence[Any],
    attempt: Attempt,
    seen: float,
    stopped: bool,
    said: str,
) -> set[Any]:
    """The round task runs of ``run`` its record left Running (``left``): Completed when
    storage says the round committed (the record had not caught up), else Crashed when
    the attempt was last ``seen`` (not at the takeover: two attempts would be in one round
    at once in the UI). The ids of those ended."""
    committed = {f"round-{r.no}": r.at for r in attempt.rounds}
    writer = PastRounds(round_task, run)
    ended: set[Any] = set()
    for task in (t for t in left if t.flow_run_id == run.id):
        begun = task.start_time.timestamp() if task.start_time else seen
        if task.name in committed:
            writer.end(RoundRun(task, None), max(committed[task.name], begun))
        elif stopped:
            writer.crash(RoundRun(task, None), max(seen, begun), said)
        else:
            continue
        ended.add(task.id)
    return ended


class PastRounds(RoundRuns):
    """:class:`RoundRuns` of a flow run other than the one this thread runs in."""

    def __init__(self, task: Any, flow_run: Any) -> None:  # no super(): no flow run context
        from prefect.context import FlowRunContext

        self.task = task
        self.flow_run = flow_run
        # a state event's flow run is the one in the context it is sent from (Prefect's
        # events worker relates it): this thread's, but with the earlier attempt's run
        here = FlowRunContext.get()
        self._context = None if here is None else here.model_copy(update={"flow_run": flow_run})

    def _set(self, run: RoundRun, state: Any) -> None:
        if self._context is None:
            return super()._set(run, state)
        with self._context:
            return super()._set(run, state)

    def crash(self, run: RoundRun, at: float, message: str) -> None:
        """``run`` Crashed at ``at`` (its driver stopped then)."""
        from datetime import timedelta

        from prefect.states import Crashed

        stamp = max(utc(at), run.task_run.state.timestamp + timedelta(microseconds=1))
        run.task_run.end_time = stamp
        self._set(run, Crashed(name=STOPPED, timestamp=stamp, message=message))


__all__ = ["Round", "record_attempts"]
