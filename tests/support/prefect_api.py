"""The Prefect API as the tests read it back: a run's flow runs, logs, artifacts, events."""

from __future__ import annotations

import asyncio
from typing import Any


def api(call: Any) -> Any:
    """``call(client)`` (an async function of a Prefect client), synchronously."""
    from prefect.client.orchestration import get_client

    async def go() -> Any:
        async with get_client() as client:
            return await call(client)

    return asyncio.run(go())


def tune_runs(name: str, then: Any = None) -> Any:
    """The ``tune`` flow runs of experiment ``name`` in the API; with ``then`` (an async
    function of the client and the runs' ids), what it reads of them."""
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    async def call(client: Any) -> Any:
        runs = await client.read_flow_runs(  # the newest first: a session's server has many
            flow_filter=FlowFilter(name=FlowFilterName(any_=["tune"])),
            sort=FlowRunSort.EXPECTED_START_TIME_DESC,
        )
        runs = [r for r in runs if r.parameters.get("name") == name]
        return runs if then is None else await then(client, [r.id for r in runs])

    return api(call)


def run_logs(name: str) -> list[str]:
    """Every log line of the ``tune`` flow runs of experiment ``name``, in the API."""
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker

    async def logs(client: Any, ids: list[Any]) -> list[str]:
        found = await client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=ids))
        )
        return [log.message for log in found]

    APILogWorker.drain_all(timeout=10)  # what the run logged, shipped before it is read
    return tune_runs(name, logs)


def artifacts(key: str) -> list[Any]:
    """Every version of the artifact ``key``, oldest first."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    async def call(client: Any) -> list[Any]:
        return await client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
            sort=ArtifactSort.CREATED_DESC,
        )

    return api(call)[::-1]


def events(name: str, resource_id: str) -> list[Any]:
    """The events named ``name`` about the resource ``resource_id``, in the API."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    with get_client(sync_client=True) as client:
        page = client.read_events(
            filter=EventFilter(
                event=EventNameFilter(name=[name]),
                resource=EventResourceFilter(id=[resource_id]),
            ),
            limit=50,
        )
    return page.events
