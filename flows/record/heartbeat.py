"""The ``tune`` flow run's heartbeats, from a thread that stops as soon as the run ends.

Prefect's flow engine emits ``prefect.flow-run.heartbeat`` events (what an
automation that spots zombie flow runs watches) from a thread that sleeps in
1 s steps, and joins that thread when the flow ends: every ``popflow.run``
waited for the rest of a step after its last round (seen between the run's last
log line and Prefect's "Finished in state"). So the ``tune`` flow runs with
the engine's heartbeats off (:func:`engine_heartbeats_off`) and emits the same
events itself (:func:`heartbeats`), at the interval the user's Prefect
settings ask for, from a thread that stops at once.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger(__name__)

EVENT = "prefect.flow-run.heartbeat"


@contextmanager
def engine_heartbeats_off() -> Iterator[int | None]:
    """Within: Prefect's flow engine emits no heartbeats (in this thread's settings only);
    yields the interval the user's settings ask for (None: no heartbeats)."""
    from prefect.settings import (
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        get_current_settings,
        temporary_settings,
    )

    every = get_current_settings().flows.heartbeat_frequency
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield every


@contextmanager
def heartbeats(every: int | None) -> Iterator[None]:
    """Within a flow run: its heartbeat event at once and every ``every`` seconds after,
    as Prefect's engine sends them; on exit the thread stops without waiting."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if every is None or ctx is None or ctx.flow_run is None:
        yield
        return
    resource, related = _event_template(ctx)
    stop = threading.Event()

    def beat() -> None:
        from prefect.events import emit_event

        while not stop.is_set():
            try:
                emit_event(event=EVENT, resource=resource, related=related)
            except Exception:  # a heartbeat is never worth the run
                logger.debug("could not emit the flow run's heartbeat", exc_info=True)
            stop.wait(every)

    # the thread sees this one's settings (PREFECT_API_URL) through a copy of its context
    thread = threading.Thread(
        target=contextvars.copy_context().run,
        args=(beat,),
        name="popflow-flow-heartbeat",
        daemon=True,
    )
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _event_template(ctx: Any) -> tuple[dict[str, str], list[Any]]:
    """The heartbeat's resource and related resources, as Prefect's engine builds them:
    the flow run; its flow, deployment and tags."""
    import prefect
    from prefect.events.related import tags_as_related_resources
    from prefect.events.schemas.events import RelatedResource

    run = ctx.flow_run
    resource = {
        "prefect.resource.id": f"prefect.flow-run.{run.id}",
        "prefect.resource.name": run.name or "",
        "prefect.version": prefect.__version__,
    }
    related: list[Any] = []
    if run.flow_id:
        related.append(
            RelatedResource.model_validate(
                {
                    "prefect.resource.id": f"prefect.flow.{run.flow_id}",
                    "prefect.resource.role": "flow",
                    "prefect.resource.name": ctx.flow.name if ctx.flow else "",
                }
            )
        )
    if run.deployment_id:
        related.append(
            RelatedResource.model_validate(
                {
                    "prefect.resource.id": f"prefect.deployment.{run.deployment_id}",
                    "prefect.resource.role": "deployment",
                }
            )
        )
    related += tags_as_related_resources(set(run.tags or []))
    return resource, related
