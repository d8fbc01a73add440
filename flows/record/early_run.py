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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from popflow.infra import local_server

logger = logging.getLogger(__name__)

#: seconds each request may take: a server that is this slow is left to Prefect's client
TIMEOUT_S = 2.0
#: settings that make Prefect's client send credentials: such a server is left to it
_CREDENTIALS = ("PREFECT_API_KEY", "PREFECT_API_AUTH_STRING")


def early_api_url() -> str | None:
    """The API a run reports to, where it is known without importing Prefect and takes
    no credentials; None otherwise (Prefect's settings decide, once imported)."""
    if in_flow_run():
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
    return _local_server_url()


def _from_prefect() -> str | None:
    from prefect.settings import get_current_settings

    api = get_current_settings().api
    if api.key or getattr(api, "auth_string", None):
        return None
    return api.url.rstrip("/") if api.url else _local_server_url()


def _local_server_url() -> str | None:
    """popflow's local server, where the embedded default uses it and it runs."""
    if not local_server.wanted():
        return None
    server = local_server.running()
    return server.api_url.rstrip("/") if server is not None else None


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


def in_flow_run() -> bool:
    """Whether the caller runs inside a Prefect flow run (a deployment's): its ``tune``
    run is a subflow, made by Prefect's engine. Prefect not imported: no flow run."""
    if "prefect.context" not in sys.modules:
        return False
    from prefect.context import FlowRunContext

    return FlowRunContext.get() is not None


@dataclass
class EarlyRun:
    """A ``tune`` flow run made Running at ``api_url`` before Prefect was imported."""

    api_url: str
    id: str
    #: set once Prefect's engine runs it: the engine owns its state from then on
    adopted: bool = False

    @classmethod
    def create(
        cls, api_url: str, name: str, parameters: dict[str, Any], tags: list[str]
    ) -> EarlyRun | None:
        """The run ``name``, Running; None where the server did not take it (Prefect's
        engine makes the run then, as it always did)."""
        try:
            flow = _call(api_url, "POST", "/flows/", {"name": "tune"})
            run = _call(
                api_url,
                "POST",
                "/flow_runs/",
                {
                    "flow_id": flow["id"],
                    "name": name,
                    "parameters": parameters,
                    "tags": tags,
                    # the engine proposes Running again when it adopts the run: a run
                    # marked resuming does not count that as a second attempt (its run
                    # count stays 1, as Prefect's retries and popflow's read it)
                    "empirical_policy": {"resuming": True},
                    "state": {"type": "RUNNING", "name": "Running"},
                },
            )
            return cls(api_url, str(run["id"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            logger.debug("the flow run was not made before Prefect's import: %s", e)
            return None

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
        if self.adopted:
            return
        state = {"type": "CRASHED", "name": "Crashed", "message": message[:500]}
        try:
            _call(
                self.api_url,
                "POST",
                f"/flow_runs/{self.id}/set_state",
                {"state": state, "force": True},
            )
        except (OSError, ValueError) as e:
            logger.debug("the early flow run %s was not ended: %s", self.id, e)


def adopt(flow: Any, early: EarlyRun, parameters: dict[str, Any]) -> Any:
    """Run the Prefect ``flow`` as the flow run ``early`` made: what the flow returns."""
    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow

    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(early.id)
    early.adopted = True
    return run_flow(flow, flow_run=flow_run, parameters=parameters)


def _call(api_url: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        api_url + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        raw = response.read()
    return json.loads(raw) if raw else None
