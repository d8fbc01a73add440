"""Deployed flows retry failures, not mistakes.

The deployed flows keep ``retries=2``: a crash of the driver's machine, a
storage outage or a lost cluster may pass. A mistake in the flow run's
parameters (an argument check's ``ValueError``/``TypeError``: a bad scheduler
argument, a trainable that does not import or is not allowed) fails the same
way every time, so retrying it only delays the Failed state (by the retry
delay, twice). Prefect 3 has no per-exception retry condition for flows (tasks
have ``retry_condition_fn``): its server turns a flow run's Failed into
AwaitingRetry while the run count is within the run's ``empirical_policy.retries``.
So before such an error leaves the flow, :func:`mistakes_not_retried` sets that
flow run's retries to 0 through the API; the run ends Failed at its first attempt.

A crash after an in-process retry must still be re-run by a worker. Prefect's server
marks a flow run it retries in process ``empirical_policy.retry_type = "in_process"``
(``RetryFailedFlows``) and its workers' query for Scheduled runs skips every run so
marked (the flow's own process will run it; ``get-runs-from-worker-queues.sql``). The
mark stays after the retry has started. Only Prefect's ``HandleFlowTerminalStateTransitions``
replaces it (with ``"reschedule"``) when a run leaves a terminal state, and a *forced*
state change skips that rule: a run that crashed during an in-process retry and was
then set Scheduled by force (``prefect flow-run retry``, an automation with ``force:
true``) stayed Scheduled for ever. ``automations.yaml`` re-runs without force, so
Prefect resets the mark itself; and on entry :func:`mistakes_not_retried` clears a
mark left from the retry now running, so a forced re-run after a crash in it is picked
up too (docs/how-to/resume-recovery.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from popflow.flows.record.prefect_context import flow_run_context

logger = logging.getLogger(__name__)

#: What argument checks raise: retrying cannot mend them.
MISTAKES = (ValueError, TypeError)


@contextmanager
def mistakes_not_retried() -> Iterator[None]:
    """In a flow's body: a :data:`MISTAKES` error that leaves it ends the flow run Failed
    without its retries; any other error is retried as the flow says. On entry, the
    in-process retry mark of a retry now running is cleared (see the module's docstring)."""
    _no_in_process_mark()
    try:
        yield
    except MISTAKES as e:
        _no_more_retries(e)
        raise


def _no_more_retries(error: BaseException) -> None:
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    flow_run = context.flow_run if context is not None else None
    if flow_run is None:  # the function called outside a flow run: nothing to retry
        return
    policy = flow_run.empirical_policy.model_copy(update={"retries": 0})
    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run(flow_run.id, empirical_policy=policy)
    except Exception as exc:  # the error still fails the run; it may be retried
        logger.warning("could not tell Prefect not to retry %s: %s", type(error).__name__, exc)
        return
    flow_run.empirical_policy = policy
    logger.info("%s is a mistake in the flow run's parameters: not retried", type(error).__name__)


def _no_in_process_mark() -> None:
    """Clear ``retry_type == "in_process"`` of the flow run this attempt runs.

    Only a retry that has started calls this, so no worker can take the run twice: the
    mark guards the wait before an in-process retry (the run is Scheduled, its own
    process will run it), and Prefect sets it again at the next retry. The flow run's
    context is read back at each attempt's start, so it shows the mark without a call."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    flow_run = context.flow_run if context is not None else None
    if flow_run is None or flow_run.empirical_policy.retry_type != "in_process":
        return
    from prefect.client.orchestration import get_client

    policy = flow_run.empirical_policy.model_copy(update={"retry_type": None})
    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run(flow_run.id, empirical_policy=policy)
    except Exception as exc:  # the run goes on; only a forced re-run after a crash waits
        logger.warning("could not clear the flow run's in-process retry mark: %s", exc)
        return
    flow_run.empirical_policy = policy
    logger.debug("cleared the in-process retry mark of flow run %s", flow_run.id)


def is_flow_retry() -> bool:
    """True inside a Prefect flow run that is being retried (run_count > 1).

    Checked both where ``run`` is called (a retried parent flow: its ``tune``
    subflow is a new run) and inside the ``tune`` flow (a retry of it).
    """
    ctx = flow_run_context()
    return bool(ctx and ctx.flow_run and ctx.flow_run.run_count > 1)


#: A flow run that has started this many times (Prefect's flow retries, and re-runs of
#: its crashes by ``automations.yaml``) is not started again: it ends Failed, which the
#: re-run automation does not answer, instead of crashing in a loop.
MAX_RUN_COUNT = 5


class TooManyRuns(RuntimeError):
    """The flow run has started more than :data:`MAX_RUN_COUNT` times."""


def refuse_crash_loop() -> None:
    """Raise :class:`TooManyRuns` in a flow run on its ``MAX_RUN_COUNT + 1``-th start."""
    ctx = flow_run_context()
    count = ctx.flow_run.run_count if ctx and ctx.flow_run else 0
    if count > MAX_RUN_COUNT:
        raise TooManyRuns(
            f"flow run {ctx.flow_run.name!r} has started {count} times (retries and re-runs "
            f"of its crashes); popflow does not start it again after {MAX_RUN_COUNT}. The "
            "experiment is committed in storage: read the earlier runs' logs, fix the "
            "cause, then run the deployment again (it resumes)"
        )
