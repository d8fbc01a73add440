"""Quiet Dask's log lines about what popflow handles and says itself.

A closing embedded worker's heartbeat failure (this is also a Dask preload module):
when the embedded cluster closes, a worker's heartbeat can be on its way to
the scheduler while the worker closes its own connection pool: Dask then logs
"Failed to communicate with scheduler during heartbeat" with a 30-line
traceback (dask/distributed#7105) on the user's console, after a run that
went well. The filter drops that record only while its worker is closing; a
heartbeat failure of a running worker is still logged.

A dead worker's failed broadcast: the embedded scheduler, in the driver's process,
logs ``broadcast to tcp://... failed: CommClosedError: ...`` at ERROR for each call
it proxied to a worker that died (popflow's calls to its trainables' actors), before
popflow's runner pool says, once, that the worker died and its trials go on from
their checkpoints.
"""

from __future__ import annotations

import logging
from typing import Any

from distributed.core import Status

HEARTBEAT_FAILED = "Failed to communicate with scheduler during heartbeat"
_CLOSING = {Status.closing, Status.closing_gracefully, Status.closed}


class ClosingHeartbeat(logging.Filter):
    """Drops the heartbeat-failure record of ``worker`` once it is closing."""

    def __init__(self, worker: Any) -> None:
        super().__init__()
        self.worker = worker

    def filter(self, record: logging.LogRecord) -> bool:
        closing = self.worker.status in _CLOSING
        return not (closing and record.getMessage().startswith(HEARTBEAT_FAILED))


def dask_setup(worker: Any) -> None:
    """Dask calls this as the worker starts (``preload``)."""
    logging.getLogger("distributed.worker").addFilter(ClosingHeartbeat(worker))
    quiet_distributed()


def quiet_distributed() -> None:
    """Dask's INFO lines not printed in this process: Dask silences its own console
    handler only, and a worker process that imports Prefect (the user's script imports
    it, and spawn imports that script) prints them through Prefect's root handler."""
    distributed = logging.getLogger("distributed")
    if distributed.getEffectiveLevel() < logging.WARNING:
        distributed.setLevel(logging.WARNING)


BROADCAST_FAILED = "broadcast to "
#: the errors of a connection to a worker that died (a failure of the call itself is kept)
_CONNECTION_ERRORS = ("CommClosedError", "StreamClosedError", "ConnectionRefusedError", "OSError")


class DeadWorkerBroadcast(logging.Filter):
    """Drops the scheduler's record of a broadcast that failed because its worker's
    connection is gone."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(BROADCAST_FAILED):
            return True
        reason = message.partition(" failed: ")[2]
        return not reason.startswith(_CONNECTION_ERRORS)


DEAD_WORKER_BROADCAST = DeadWorkerBroadcast()
