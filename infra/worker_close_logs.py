"""Quiet a closing embedded worker's heartbeat failure (a Dask preload module).

When the embedded cluster closes, a worker's heartbeat can be on its way to
the scheduler while the worker closes its own connection pool: Dask then logs
"Failed to communicate with scheduler during heartbeat" with a 30-line
traceback (dask/distributed#7105) on the user's console, after a run that
went well. The filter drops that record only while its worker is closing; a
heartbeat failure of a running worker is still logged.
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
