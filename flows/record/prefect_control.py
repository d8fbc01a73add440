"""Cancel from Prefect: a cancel of the ``tune`` flow run (or of the flow run it is a
subflow of, a deployment's) stops the experiment as its budget would.

A flow run that no worker runs (a script's) is told of a cancel only through its
state in the API: it goes Cancelling, and nothing stops the process. So, while the
``tune`` flow runs, a thread of the record (:func:`cancel_watch`) reads the state of
that run and of its parent flow run every :data:`POLL_S` seconds; once either is
Cancelling (or Cancelled) it asks the driver to stop (:class:`~popflow.flows.driver.
early_end.StopAsked`). The driver looks at its budget as each segment returns and
at each round's end: it cancels what is in flight, commits what finished and ends
the run resumably; the experiment's lease is released as for any end; the record
ends the flow run Cancelled, its message saying what was committed and how to
resume (:func:`cancelled_state`).

A process worker's cancel (``prefect flow-run cancel`` of a deployment's run) goes
further: Prefect's runner sends the process SIGTERM at once (after telling its
control listener), and SIGKILL 30 s later if it has not exited
(``prefect.runner._cancellation_manager``). What the experiment had committed is
kept and the next run resumes from it; the round in flight runs again.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from popflow.flows.driver.early_end import StopAsked
from popflow.flows.record.prefect_context import CANCEL_TYPES
from popflow.flows.record.run_log import run_logger

logger = logging.getLogger(__name__)

#: Seconds between two looks at the flow runs' states (one small API read each).
POLL_S = 1.0


@contextmanager
def cancel_watch(stop: StopAsked, every: float = POLL_S) -> Iterator[None]:
    """Within the ``tune`` flow run: a cancel of it (or of its parent flow run) asks
    ``stop``; on exit the watching thread stops without waiting out its interval."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        yield
        return
    run = ctx.flow_run
    done = threading.Event()

    def watch() -> None:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            watched = _watched(client, run)
            while not done.wait(every) and stop.why is None:
                for run_id, whose in watched:
                    if _cancelling(client, run_id):
                        stop.ask(f"cancelled from Prefect ({whose})")
                        run_logger().info(
                            "%s was cancelled: the run stops as its segments in flight "
                            "return, and commits what finished",
                            whose,
                        )
                        break

    # the thread sees this one's settings (PREFECT_API_URL) through a copy of its context
    thread = threading.Thread(
        target=contextvars.copy_context().run,
        args=(_never_raising, watch),
        name="popflow-cancel-watch",
        daemon=True,
    )
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def _never_raising(watch: Any) -> None:
    try:
        watch()
    except Exception:  # Prefect is told, never relied on: the run goes on
        logger.warning("could not watch the flow run for a cancel", exc_info=True)


def _watched(client: Any, run: Any) -> list[tuple[UUID, str]]:
    """The flow runs whose cancel stops the run: the ``tune`` one and its parent's."""
    watched = [(run.id, f"flow run {run.name!r}")]  # the stop's reason names it
    if run.parent_task_run_id is not None:
        try:
            parent = client.read_task_run(run.parent_task_run_id).flow_run_id
        except Exception:
            logger.debug("could not read the parent of flow run %s", run.id, exc_info=True)
        else:
            if parent is not None:
                watched.append((parent, f"its parent flow run {parent}"))
    return watched


def _cancelling(client: Any, run_id: UUID) -> bool:
    """Whether the flow run is Cancelling or Cancelled (an unanswered read: not). Read as
    plain JSON: the flow run's model (its parameters, the spec's view, among them) cost
    the watch most of a CPU-second a minute to validate, time the training shares."""
    try:
        response = client._client.get(f"/flow_runs/{run_id}")
        response.raise_for_status()
        state = response.json().get("state") or {}
    except Exception:
        logger.debug("could not read flow run %s's state", run_id, exc_info=True)
        return False
    return state.get("type") in CANCEL_TYPES


def cancelled_state(stop: StopAsked, message: str, data: Any) -> Any:
    """The ``tune`` flow run's final state when a cancel ended the run (None: it did not):
    Cancelled, saying what was committed and how to resume."""
    if not stop.honoured:
        return None
    from prefect.states import Cancelled

    return Cancelled(message=message, data=data)


def worker_cancel_state(error: BaseException, experiment: str) -> Any:
    """The ``tune`` flow run's final state when its worker's cancel (SIGTERM after the
    cancel intent) interrupted the training (None: another interrupt, a crash): Cancelled,
    not Crashed, so that it reads as what the user asked and is not re-run as a crash."""
    from prefect._internal import control_listener
    from prefect.exceptions import TerminationSignal
    from prefect.states import Cancelled

    if not isinstance(error, TerminationSignal) or control_listener.get_intent() != "cancel":
        return None
    return Cancelled(
        message=f"{experiment}: cancelled from Prefect (its worker stopped the process); "
        "the rounds committed before it are kept: resume (resume='auto', or run the "
        "deployment again) goes on from the last, the round in flight runs again"
    )
