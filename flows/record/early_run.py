"""The ``tune`` flow run made Running over plain HTTP, before Prefect is imported.

Prefect's import takes a CPU-second or more, and on a small machine it competes with
the cluster's start: waiting for it before the first round made every run's first
segment start about a second later. Where the server the run reports to is known
without Prefect (``PREFECT_API_URL`` in the environment, or popflow's local server
already running) and asks for no credentials, the record creates its flow run with
two requests (the ``tune`` flow, then the run, Running) as soon as the experiment is
named; Prefect's engine adopts that run later (:func:`adopt`), so the run's start time
is before its first round, whatever the import costs.

The server is read as Prefect would read it, without its import: Prefect's own settings
if it is imported already; else the environment's ``PREFECT_API_URL``, the active
profile's, or popflow's local server; a ``.env``, ``prefect.toml`` or ``pyproject.toml``
with Prefect settings in the working folder leaves it to Prefect. The guess is checked
once Prefect is imported: a run made on another server than the one Prefect's settings
name is deleted, and the engine makes its own (the first round may then begin before it). A record that fails before the engine adopts
the run ends it Crashed, so no run stays Running.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tomllib
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from popflow.flows.record.prefect_context import CANCEL_TYPES, flow_run_context
from popflow.infra import local_server

logger = logging.getLogger(__name__)

#: seconds each request may take: a server that is this slow is left to Prefect's client
TIMEOUT_S = 2.0
#: settings that make Prefect's client send credentials: such a server is left to it
_CREDENTIALS = ("PREFECT_API_KEY", "PREFECT_API_AUTH_STRING")


def early_api_url() -> str | None:
    """The API a run reports to, where it is known without importing Prefect and takes
    no credentials; None otherwise (Prefect's settings decide, once imported)."""
    if flow_run_context() is not None:
        return None
    if "prefect.settings" in sys.modules:  # imported already: its settings, as they are now
        return _from_prefect()
    if any(os.environ.get(name) for name in _CREDENTIALS):
        return None
    url = os.environ.get("PREFECT_API_URL")  # the environment wins over every other source
    if url:
        return url.rstrip("/")
    if _files_may_set_the_api():
        return None
    profile = _active_profile()
    if profile is None or any(profile.get(name) for name in _CREDENTIALS):
        return None  # unreadable, or a server with credentials: Prefect's client decides
    if profile.get("PREFECT_API_URL"):
        return str(profile["PREFECT_API_URL"]).rstrip("/")
    return local_server.serving_url()


def _from_prefect() -> str | None:
    from prefect.settings import get_current_settings

    api = get_current_settings().api
    if api.key or getattr(api, "auth_string", None):
        return None
    return api.url.rstrip("/") if api.url else local_server.serving_url()


def _files_may_set_the_api() -> bool:
    """Whether a settings file in the working folder may name the API (Prefect reads a
    ``.env``, a ``prefect.toml`` and ``pyproject.toml``'s ``[tool.prefect]`` there, over
    the profile): then only Prefect knows."""
    folder = Path.cwd()
    for name, marker in (
        (".env", "PREFECT_"),
        ("prefect.toml", ""),
        ("pyproject.toml", "tool.prefect"),
    ):
        path = folder / name
        try:
            if path.is_file() and marker in path.read_text(errors="replace"):
                return True
        except OSError:
            return True
    return False


def _active_profile() -> dict[str, Any] | None:
    """The settings of Prefect's active profile (``PREFECT_PROFILE``, else the profiles
    file's ``active``); {} where there is none; None where the file cannot be read."""
    home = Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()
    path = Path(os.environ.get("PREFECT_PROFILES_PATH") or home / "profiles.toml").expanduser()
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, ValueError):
        return None
    active = os.environ.get("PREFECT_PROFILE") or data.get("active") or "ephemeral"
    profile = (data.get("profiles") or {}).get(active) or {}
    return profile if isinstance(profile, dict) else None


@dataclass
class EarlyRun:
    """A ``tune`` flow run made Running at ``api_url`` before Prefect was imported."""

    api_url: str
    id: str
    #: set once Prefect's engine runs it: the engine owns its state from then on
    adopted: bool = False
    #: called with the reason when a cancel reached the run before the engine adopted it
    #: (the record's cancel watch starts with the engine)
    on_cancel: Callable[[str], None] | None = None
    name: str = ""

    @classmethod
    def create(
        cls, api_url: str, name: str, parameters: dict[str, Any], tags: list[str]
    ) -> EarlyRun | None:
        """The run ``name``, Running; None where the server did not take it (Prefect's
        engine makes the run then, as it always did)."""
        # a run made but answered after the timeout is found by its key, not made twice
        key = f"popflow-early-{uuid.uuid4().hex}"
        try:
            flow = _call(api_url, "POST", "/flows/", {"name": "tune"})
        except (OSError, ValueError) as e:
            logger.debug("the flow run was not made before Prefect's import: %s", e)
            return None
        body = dict(  # Prefect's FlowRunCreate
            flow_id=flow["id"],
            name=name,
            parameters=parameters,
            tags=tags,
            idempotency_key=key,
            # the engine proposes Running again when it adopts the run: a run marked
            # resuming does not count that as a second attempt (its run count stays 1,
            # as Prefect's retries and popflow's read it)
            empirical_policy={"resuming": True},
            state={"type": "RUNNING", "name": "Running"},
        )
        try:
            run = _call(api_url, "POST", "/flow_runs/", body)
        except (OSError, ValueError) as e:
            run = _made(api_url, key)
            if run is None:
                logger.debug("the flow run was not made before Prefect's import: %s", e)
                return None
        return cls(api_url, str(run["id"]), name=name)

    @property
    def url(self) -> str:
        """The run's page in the Prefect UI (as Prefect's ``url_for`` makes it)."""
        ui = os.environ.get("PREFECT_UI_URL") or self.api_url.removesuffix("/api")
        return f"{ui.rstrip('/')}/runs/flow-run/{self.id}"

    def serves(self, api_url: str | None) -> bool:
        """Whether the run is on the server Prefect's settings name."""
        return bool(api_url) and api_url.rstrip("/") == self.api_url

    def withdraw(self) -> None:
        """Delete the run: it was made on a server the record does not report to."""
        try:
            _call(self.api_url, "DELETE", f"/flow_runs/{self.id}")
        except (OSError, ValueError) as e:
            logger.debug("the early flow run %s was not deleted: %s", self.id, e)

    def crash(self, message: str) -> None:
        """End the run Crashed: the record failed before the engine adopted it."""
        if not self.adopted:
            self._force({"type": "CRASHED", "name": "Crashed", "message": message[:500]})

    def take_back_a_cancel(self) -> bool:
        """A cancel that reached the run before the engine adopts it: the run is made
        Running again for the engine (which would not run a Cancelling run), and
        :attr:`on_cancel` stops the training as the cancel watch would; the run then
        ends Cancelled. Whether there was one."""
        try:
            state = (_call(self.api_url, "GET", f"/flow_runs/{self.id}") or {}).get("state")
        except (OSError, ValueError) as e:
            logger.debug("could not read the early flow run %s: %s", self.id, e)
            return False
        if (state or {}).get("type") not in CANCEL_TYPES:
            return False
        if self.on_cancel is not None:
            self.on_cancel(f"cancelled from Prefect (flow run {self.name!r})")
        self._force({"type": "RUNNING", "name": "Running", "message": "cancel seen: stopping"})
        return True

    def _force(self, state: dict[str, Any]) -> None:
        try:
            body = {"state": state, "force": True}
            _call(self.api_url, "POST", f"/flow_runs/{self.id}/set_state", body)
        except (OSError, ValueError) as e:
            logger.debug("the early flow run %s was not set %s: %s", self.id, state["type"], e)


#: The state types a cancel leaves a flow run in.
#: How many times the engine is given the run when a cancel lands as it adopts it.
_ADOPTIONS = 3


def adopt(flow: Any, early: EarlyRun, parameters: dict[str, Any]) -> Any:
    """Run the Prefect ``flow`` as the flow run ``early`` made: what the flow returns. A
    cancel that reached the run before (the UI shows it from its start) stops the
    training and ends the run Cancelled, as a cancel of a running flow does."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import UnfinishedRun
    from prefect.flow_engine import run_flow

    said_early = SaidEarly(early.id)
    engine_lines = logging.getLogger("prefect.flow_runs")
    for attempt in range(_ADOPTIONS):
        early.take_back_a_cancel()
        with get_client(sync_client=True) as client:
            flow_run = client.read_flow_run(early.id)
        early.adopted = True
        engine_lines.addFilter(said_early)
        try:
            return run_flow(flow, flow_run=flow_run, parameters=parameters)
        except UnfinishedRun:
            # the engine found the run Cancelling (a cancel between the look and its
            # start) and ran nothing: taken back, once more
            if attempt + 1 == _ADOPTIONS or not early.take_back_a_cancel():
                raise
            early.adopted = False
        finally:
            engine_lines.removeFilter(said_early)
    raise AssertionError("unreachable")  # pragma: no cover


#: The engine's first lines of a flow run, which the record said when it made the run
#: (:func:`first_lines`): the engine says them when it adopts it, seconds later (after
#: the results, for a run shorter than Prefect's import)
_FIRST_LINES = ("Beginning flow run ", "View at ")


def first_lines(early: EarlyRun) -> list[str]:
    """The run's first lines, as Prefect's engine says them, to say when it is made."""
    return [f"Beginning flow run {early.name!r} for flow 'tune'", f"View at {early.url}"]


class SaidEarly(logging.Filter):
    """Drops the engine's first lines of the run ``flow_run_id``: said already."""

    def __init__(self, flow_run_id: str) -> None:
        super().__init__()
        self.flow_run_id = flow_run_id

    def filter(self, record: logging.LogRecord) -> bool:
        mine = str(getattr(record, "flow_run_id", "")) == self.flow_run_id
        return not (mine and record.getMessage().startswith(_FIRST_LINES))


def _made(api_url: str, key: str) -> dict[str, Any] | None:
    """The flow run made with idempotency ``key``, if the server made it."""
    try:
        runs = _call(
            api_url,
            "POST",
            "/flow_runs/filter",
            {"flow_runs": {"idempotency_key": {"any_": [key]}}, "limit": 1},
        )
    except (OSError, ValueError) as e:
        logger.debug("could not look for the early flow run %s: %s", key, e)
        return None
    return runs[0] if runs else None


def _call(api_url: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        api_url + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        raw = response.read()
    return json.loads(raw) if raw else None
