"""After a takeover: the killed driver's Prefect runs are marked Crashed, so the UI tells
the truth.

A driver killed mid-round (SIGKILL, a lost machine) leaves its ``tune`` flow run, its
round task run and its parent flow run Running in the Prefect API for ever. When a
new driver resumes the experiment, it holds the lease, so any other ``tune`` run of
the same experiment still marked Running is dead (or stops at its next lease check):
it, and its parent if that is not the new driver's own, are set to Crashed, saying
who took over. Its round task runs left Running end when storage says: Completed at
their commit (its record lagged), or Crashed at the driver's last sign of life
(:mod:`popflow.flows.record.attempt_history`); only a round storage cannot date is
Crashed now. The state is named "Superseded": its event,
``prefect.flow-run.Superseded``, is not the ``prefect.flow-run.Crashed`` that the
re-run automation (``automations.yaml``) answers, so a run already taken over is
not re-run.

Then every earlier attempt is made visible with the rounds it committed, from storage
(:mod:`popflow.flows.record.attempt_history`): the rounds its record never wrote, the
round it was in, and a flow run of its own for an attempt killed before its record began.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

from popflow.flows.record.flow_parameters import runs_experiment

logger = logging.getLogger(__name__)


def close_stale_runs(experiment: str, epoch: int, objects: Any) -> int:
    """Mark the other Running ``tune`` flow runs of ``experiment`` (and what they hold),
    and the task runs an earlier attempt of this one left Running, Crashed; how many
    flow runs were cleaned up. Best effort: the API's trouble is logged,
    never raised (the training goes on either way)."""
    from prefect.runtime import flow_run

    current = flow_run.id
    if current is None:
        return 0
    left: list[Any] = []  # the rounds earlier drivers left Running
    try:
        marked = _close(
            experiment,
            _experiment_url(),
            UUID(str(current)),
            flow_run.parent_flow_run_id,
            epoch,
            left,
        )
    except Exception as e:  # the API is not the truth; storage is
        logger.warning("could not mark the runs of earlier drivers Crashed: %s", e)
        marked = 0
    ended: set[Any] = set()
    try:
        ended = _record_attempts(experiment, UUID(str(current)), epoch, objects, left)
    except Exception as e:  # best effort, as above: the training goes on
        logger.warning("could not record the earlier attempts of %s in Prefect: %s", experiment, e)
    try:
        _crash_now([t for t in left if t.id not in ended], _message(experiment, current, epoch))
    except Exception as e:
        logger.warning("could not mark the rounds of earlier drivers Crashed: %s", e)
    return marked


def _message(experiment: str, current: Any, epoch: int) -> str:
    return (
        f"killed or stopped, then taken over: experiment {experiment!r} was resumed by flow "
        f"run {current} (driver epoch {epoch})"
    )


def _crash_now(tasks: list[Any], message: str) -> None:
    """Rounds left Running that storage could not date (no history of their driver):
    Crashed now."""
    if not tasks:
        return
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    with get_client(sync_client=True) as client:
        for task in tasks:
            state = Crashed(name="Superseded", message=message)
            client.set_task_run_state(task.id, state, force=True)


def _record_attempts(
    experiment: str, current: UUID, epoch: int, objects: Any, left: list[Any]
) -> set[Any]:
    """The earlier attempts, from the experiment's storage (the ``tune`` run's ``spec``);
    ``objects``: the ``tune`` flow and its ``round`` task, which they are written as;
    ``left``: the round task runs earlier drivers left Running. The ids of those it ended
    (at their driver's last sign of life)."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext, TagsContext

    from popflow.flows.record.attempt_history import record_attempts

    context = FlowRunContext.get()
    spec = (context.parameters or {}).get("spec") if context is not None else None
    spec = getattr(spec, "value", spec)  # a Shown spec (flow_parameters)
    storage = getattr(spec, "storage", None)
    if storage is None:
        return set()
    tags = sorted(TagsContext.get().current_tags or [])
    with get_client(sync_client=True) as client:
        written, ended = record_attempts(
            client, experiment, storage.child(spec.name), epoch, current, tags, objects, left
        )
    if written:
        logger.info(
            "%s: wrote %d round(s) or run(s) of earlier attempts from storage", experiment, written
        )
    return ended


def _experiment_url() -> str | None:
    """The experiment's storage URL, from this ``tune`` flow run's ``spec`` (None: unknown)."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    spec = (context.parameters or {}).get("spec") if context is not None else None
    spec = getattr(spec, "value", spec)  # a Shown spec (flow_parameters)
    storage = getattr(spec, "experiment_storage", None)
    return getattr(storage, "url", None)


def _close(
    experiment: str, url: str | None, current: UUID, parent: Any, epoch: int, left: list[Any]
) -> int:
    """Mark the other Running ``tune`` runs of the experiment (and their parents) Crashed;
    their Running round task runs go to ``left`` (ended at their driver's last sign of
    life, not now: the UI would show two attempts in the same round at once)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        TaskRunFilter,
        TaskRunFilterFlowRunId,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    running = [StateType.RUNNING, StateType.PENDING]
    message = _message(experiment, current, epoch)

    def superseded() -> Any:
        return Crashed(name="Superseded", message=message)

    marked = 0
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["tune"])),
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=running))
            ),
        )
        for run in runs:
            if not runs_experiment(run.parameters, experiment, url):
                continue
            tasks = client.read_task_runs(
                task_run_filter=TaskRunFilter(
                    flow_run_id=TaskRunFilterFlowRunId(any_=[run.id]),
                    state=TaskRunFilterState(type=TaskRunFilterStateType(any_=running)),
                )
            )
            # this driver's own run has no round running yet: what runs in it is an
            # earlier attempt's (Prefect gives a re-run parent its old subflow run back)
            left.extend(tasks)
            marked += bool(tasks) if run.id == current else 1
            if run.id == current:
                continue
            client.set_flow_run_state(run.id, superseded(), force=True)
            if run.parent_task_run_id is not None:  # its parent flow run, unless it is ours
                parent_task = client.read_task_run(run.parent_task_run_id)
                holder = parent_task.flow_run_id
                if holder is not None and str(holder) != str(parent) and holder != current:
                    holder_run = client.read_flow_run(holder)
                    if holder_run.state is not None and holder_run.state.type in running:
                        client.set_flow_run_state(holder, superseded(), force=True)
    if marked:
        logger.warning("%s: marked the runs of %d earlier driver(s) Crashed", experiment, marked)
    return marked
