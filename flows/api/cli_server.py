"""``popflow server``: the local Prefect server of ``PREFECT_HOME``
(:mod:`popflow.infra.local_server`), the one runs on the embedded default start and reuse.

popflow server                  # its UI address, if it is up
popflow server start            # start it (or find it), wait until it answers
eval "$(popflow server start)"  # ... and point this shell's Prefect at it
popflow server stop             # stop it (by its PID)

``start`` prints the UI's address on stderr and, on stdout, the one line a shell
needs to use the server (``export PREFECT_API_URL=...``), so ``eval`` takes
just that line. A second ``start`` finds the running server and prints the same.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from popflow.flows.api.cli_reading import UserError

ACTIONS = ("status", "start", "stop")


def add_server_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "action",
        nargs="?",
        choices=ACTIONS,
        default="status",
        help="status (the default): its UI's address, if it is up; start: start it (or find "
        'it), wait until it answers, print `export PREFECT_API_URL=...` (eval "$(popflow '
        'server start)"); stop: stop it',
    )
    p.add_argument(
        "--port", type=int, help="start: the port for a new server (default: a free one)"
    )


def server_command(args: argparse.Namespace) -> int:
    """``popflow server [status|start|stop]``; its exit status."""
    from popflow.infra import local_server

    home = local_server.prefect_home()
    if args.port is not None and args.action != "start":
        raise UserError(f"--port is for `popflow server start`, not {args.action!r}")
    if args.action == "start":
        return _start(home, args.port)
    if args.action == "stop":
        stopped = local_server.stop(home)
        print(f"stopped the local Prefect server (pid {stopped.pid})" if stopped else
              f"no local Prefect server of {home} was running")  # fmt: skip
        return 0
    server = local_server.running(home)
    _say_where_runs_report(server)
    if server is None:
        print(f"no local Prefect server of {home} is running "
              "(`popflow server start` or the next run starts one)")  # fmt: skip
        return 0
    print(f"Prefect UI: {server.ui_url}  (API {server.api_url}; pid {server.pid}; home {home})")
    return 0


def _say_where_runs_report(server: object | None) -> None:
    """On stderr: runs report to the ``PREFECT_API_URL`` of this shell, where it names
    another server than the local one (a user who set it and forgot)."""
    url = os.environ.get("PREFECT_API_URL", "").rstrip("/")
    if url and (server is None or url != getattr(server, "api_url", "").rstrip("/")):
        print(f"note: PREFECT_API_URL is {url}: runs started from this shell report there, "
              "not to popflow's local server (unset it to use the local one)", file=sys.stderr)  # fmt: skip


def _start(home: Path, port: int | None) -> int:
    from popflow.infra import local_server

    before = local_server.running(home)
    if port is not None and before is not None and before.port != port:
        raise UserError(
            f"the local Prefect server of {home} runs on port {before.port}, not {port}",
            "`popflow server stop` first to move it",
        )
    try:
        server = local_server.local_server(home, port)
    except local_server.PortInUse as e:
        raise UserError(str(e)) from e
    except (RuntimeError, TimeoutError, OSError) as e:
        # its log's tail is in the message: the first line alone is the one-line error
        raise UserError(str(e).splitlines()[0], f"PREFECT_HOME is {home}") from e
    how = "already running" if before is not None and before.pid == server.pid else "started"
    print(f"Prefect UI: {server.ui_url}  (popflow's local Prefect server, {how}; pid "
          f"{server.pid}; home {home}; `popflow server stop` stops it)", file=sys.stderr)  # fmt: skip
    print(f"export PREFECT_API_URL={server.api_url}")
    return 0
