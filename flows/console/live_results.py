"""The running segments' latest results, as their workers send them
(:mod:`popflow.tasks.progress_events`), for the console's table only.

Events come in on the Dask client's thread; the table reads them on the
driver's. A trial's entry is dropped when its segment's outcome is reduced,
and an event older than that is ignored, so a row never shows a result its
segment's outcome has overtaken.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from typing import Any

_RUNS = itertools.count()


class LiveResults:
    def __init__(self) -> None:
        #: a topic of this driver's own (a cluster may be shared with other drivers)
        self.topic = f"popflow-progress-{os.getpid()}-{next(_RUNS)}-{time.time_ns()}"
        self._lock = threading.Lock()
        self._latest: dict[str, tuple[float, dict[str, Any]]] = {}
        self._reduced: dict[str, float] = {}
        self._client: Any = None

    def subscribe(self, client: Any) -> None:
        client.subscribe_topic(self.topic, self._event)
        self._client = client

    def close(self) -> None:
        if self._client is not None:
            # the client may be closing already: nothing left to stop then
            with contextlib.suppress(Exception):
                self._client.unsubscribe_topic(self.topic)
            self._client = None

    def _event(self, event: tuple[float, dict[str, Any]]) -> None:
        at, msg = event
        trial_id = msg.get("trial_id")
        if not isinstance(trial_id, str):
            return
        with self._lock:
            if at > self._reduced.get(trial_id, 0.0):
                self._latest[trial_id] = (at, msg.get("result") or {})

    def reduced(self, trial_id: str) -> None:
        """``trial_id``'s segment came back: what it sent meanwhile is history."""
        with self._lock:
            self._latest.pop(trial_id, None)
            self._reduced[trial_id] = time.time()

    def latest(self, trial_id: str) -> dict[str, Any] | None:
        with self._lock:
            entry = self._latest.get(trial_id)
        return entry[1] if entry is not None else None
