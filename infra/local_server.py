"""The embedded default's Prefect server: one ``prefect server start`` per ``PREFECT_HOME``,
started by the first run that needs it and reused by the runs after it.

Prefect's own embedded default starts a temporary server inside every script
and stops it at the script's end (seconds each time, more for a new database:
benchmarks/RESULTS.md). popflow instead starts one on 127.0.0.1 in the background, with the
``PREFECT_HOME``'s database, and leaves it running: a later run finds it in
``<PREFECT_HOME>/popflow-server.json`` and uses it at once, and its UI outlives
the script. ``popflow server start`` starts it (or finds it) for deployments and
workers, ``popflow server stop`` stops it (by its PID).

Setting ``POPFLOW_PREFECT_SERVER=temporary`` keeps Prefect's temporary server;
a user's own ``PREFECT_API_URL`` is always used as it is (see
:func:`popflow.flows.record.prefect_server.prefect_api`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

#: How the embedded default gets its Prefect server: "local" (popflow's, reused) or
#: "temporary" (Prefect's own, started and stopped by each script).
MODE_VARIABLE = "POPFLOW_PREFECT_SERVER"
#: Seconds a new server may take to answer: a new database is migrated first, while the
#: Dask workers start beside it, and a loaded machine is slower still.
STARTUP_TIMEOUT_S = 120.0
RECORD = "popflow-server.json"


class PortInUse(RuntimeError):
    """The port asked for a new local server is taken."""


@dataclass(frozen=True)
class LocalServer:
    """A server popflow started: its process, and where it answers."""

    pid: int
    port: int
    home: str

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def answers(self, timeout: float = 2.0) -> bool:
        """The server's health endpoint answers, and its process is the one recorded."""
        if not _alive(self.pid):
            return False
        try:
            with urllib.request.urlopen(f"{self.api_url}/health", timeout=timeout) as r:
                return r.status == 200
        except OSError:
            return False

    def ui_api_url(self, timeout: float = 2.0) -> str | None:
        """The API address the server's UI calls (its ``/ui-settings``), if it says one."""
        try:
            with urllib.request.urlopen(f"{self.ui_url}/ui-settings", timeout=timeout) as r:
                return json.loads(r.read()).get("api_url")
        except (OSError, ValueError, AttributeError):
            return None


def prefect_home() -> Path:
    """Prefect's home folder, as Prefect reads it (``PREFECT_HOME``, else ``~/.prefect``)."""
    return Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()


def wanted() -> bool:
    """Whether the embedded default uses popflow's local server (``MODE_VARIABLE``)."""
    mode = os.environ.get(MODE_VARIABLE, "local").strip().lower()
    if mode not in ("local", "temporary"):
        raise ValueError(f"{MODE_VARIABLE} is {mode!r}, but must be 'local' or 'temporary'")
    return mode == "local"


def running(home: Path | None = None) -> LocalServer | None:
    """The local server of ``home`` (default :func:`prefect_home`) if it answers."""
    server = _read(home or prefect_home())
    return server if server is not None and server.answers() else None


def serving_url() -> str | None:
    """The API of popflow's local server where the embedded default uses it (no
    ``PREFECT_API_URL``) and it answers now; else None."""
    if not wanted():
        return None
    server = running()
    return server.api_url.rstrip("/") if server is not None else None


def _serves_its_ui(server: LocalServer) -> bool:
    """Its UI calls its own API. A server started by popflow before 0.x (no UI settings)
    sent the UI to port 4200: someone else's server, or none."""
    return server.ui_api_url() == server.api_url


def local_server(home: Path | None = None, port: int | None = None) -> LocalServer:
    """The local server of ``home``: the running one, else one started now (waited for)
    on ``port`` (default: a free one).

    Two scripts starting at once start one server: the check and the start
    happen under a lock on a file in ``home``.
    """
    home = home or prefect_home()
    home.mkdir(parents=True, exist_ok=True)
    server = running(home)
    if server is not None and _serves_its_ui(server):
        return server
    with _locked(home):
        server = running(home)  # another script may have started it meanwhile
        if server is not None and not _serves_its_ui(server):
            logger.info(
                "restarting the local Prefect server: its UI called %s", server.ui_api_url()
            )
            _stop_locked(home)
            server = None
        if server is None:
            server = _start(home, port)
    return server


def stop(home: Path | None = None, timeout: float = 30.0) -> LocalServer | None:
    """Stop the local server of ``home`` by its PID (its process group); the one stopped."""
    home = home or prefect_home()
    with _locked(home):
        return _stop_locked(home, timeout)


def _stop_locked(home: Path, timeout: float = 30.0) -> LocalServer | None:
    server = _read(home)
    if server is None:
        return None
    if _alive(server.pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(server.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(server.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
    (home / RECORD).unlink(missing_ok=True)
    return server


def _start(home: Path, port: int | None = None) -> LocalServer:
    if port and not _can_bind(port):  # else the server's own start fails, less clearly
        raise PortInUse(f"port {port} of 127.0.0.1 is in use: choose another, or none")
    port = port or _free_port()
    server = LocalServer(0, port, str(home))
    # The server's UI asks /ui-settings where its API is; Prefect answers from these
    # settings, not from --port (else the UI calls port 4200: someone else's server, or none).
    # They override a profile's or the user's own values, which name another server.
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_API_HOST": "127.0.0.1",
        "PREFECT_SERVER_API_PORT": str(port),
        "PREFECT_UI_API_URL": server.api_url,
        "PREFECT_UI_URL": server.ui_url,
    }
    env.pop("PREFECT_API_URL", None)
    env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # offline: no telemetry lines
    log_path = home / "popflow-server.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start",
             "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives the script, and stops as one group
        )  # fmt: skip
    server = LocalServer(proc.pid, port, str(home))
    logger.info("starting a local Prefect server on %s (it stays for later runs)", server.ui_url)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.answers(timeout=1.0):
        if proc.poll() is not None:
            raise RuntimeError(
                f"the local Prefect server exited with {proc.returncode}; its log: {log_path}:\n"
                + _tail(log_path)
            )
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            raise TimeoutError(
                f"the local Prefect server did not answer within {STARTUP_TIMEOUT_S:.0f} s; "
                f"its log: {log_path}"
            )
        time.sleep(0.2)
    (home / RECORD).write_text(json.dumps(asdict(server)))
    return server


def _read(home: Path) -> LocalServer | None:
    try:
        return LocalServer(**json.loads((home / RECORD).read_text()))
    except (OSError, ValueError, TypeError):
        return None


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[None]:
    with open(home / "popflow-server.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (a child of this process that exited) is not a server
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _can_bind(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
