"""Which Prefect server a run reports to, and whether it answers yet.

A user's own ``PREFECT_API_URL`` (environment or profile) is used as it is; else
popflow's local server (:mod:`popflow.infra.local_server`, started by the first run and
reused), or with ``POPFLOW_PREFECT_SERVER=temporary`` Prefect's temporary one, made
quiet (no telemetry) and given time to start on a loaded machine.
"""

from __future__ import annotations

import logging
import os
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from popflow.infra import local_server

#: Prefect's setting for its server's telemetry service.
ANALYTICS = "PREFECT_SERVER_ANALYTICS_ENABLED"
#: Prefect's setting for how long it waits for its embedded server to answer.
STARTUP_TIMEOUT = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
#: popflow's wait (Prefect's is 20 s, which a loaded small machine overran: the
#: server's first start migrates its database while the Dask workers start).
EMBEDDED_STARTUP_TIMEOUT_S = 90


def _users_own(setting: str) -> bool:
    """Whether the user set ``setting``, in the environment or in their Prefect profile."""
    from prefect.context import get_settings_context

    if setting in os.environ:
        return True
    return any(getattr(k, "name", "") == setting for k in get_settings_context().profile.settings)


def quiet_embedded_server() -> None:
    """Start Prefect's embedded server (no ``PREFECT_API_URL``) without its telemetry
    service, which prints ``Failed to send telemetry`` offline and a ``database is
    locked`` traceback under load. A user's own setting (environment or profile) is kept."""
    from prefect.settings import get_current_settings

    if get_current_settings().api.url or _users_own(ANALYTICS):
        return
    os.environ[ANALYTICS] = "false"


@contextmanager
def embedded_server_settings() -> Iterator[None]:
    """Within: the embedded server (no ``PREFECT_API_URL``) quiet, and waited for
    ``EMBEDDED_STARTUP_TIMEOUT_S`` when it starts; a user's own settings are kept."""
    from prefect.settings import (
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        get_current_settings,
        temporary_settings,
    )

    quiet_embedded_server()
    if get_current_settings().api.url or _users_own(STARTUP_TIMEOUT):
        yield
        return
    wait = {PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: EMBEDDED_STARTUP_TIMEOUT_S}
    with temporary_settings(updates=wait):
        yield


#: Seconds a server has to answer its health check before the rounds go on without it
HEALTH_TIMEOUT_S = 2.0


def server_answers() -> bool:
    """Whether the server this run will report to answers now: the user's own
    (``PREFECT_API_URL``), or popflow's local one already started; not one that must
    start first (the embedded default's first run, Prefect's temporary server)."""
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if not url:
        return local_server.serving_url() is not None
    return answers(url)


def answers(api_url: str) -> bool:
    """Whether the Prefect API at ``api_url`` answers its health check within
    :data:`HEALTH_TIMEOUT_S`."""
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=HEALTH_TIMEOUT_S):
            return True
    except (OSError, ValueError):
        return False


@contextmanager
def prefect_api() -> Iterator[None]:
    """Within: the Prefect API this run reports to. A user's own ``PREFECT_API_URL``
    (environment or profile) as it is; else popflow's local server
    (:mod:`popflow.infra.local_server`, started by the first run and reused), or
    with ``POPFLOW_PREFECT_SERVER=temporary`` Prefect's temporary one."""
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    if get_current_settings().api.url or not local_server.wanted():
        with embedded_server_settings():
            yield
        return
    server = local_server.local_server()
    # beside Prefect's own lines on the console (popflow's logger is quiet by default)
    logging.getLogger("prefect").info(
        "Prefect UI: %s (popflow's local server, kept for later runs; `popflow server stop`)",
        server.ui_url,
    )
    with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
        yield
