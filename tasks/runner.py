"""The segment runner: a Dask actor that runs segments on its worker.

A Dask task goes client -> scheduler -> worker -> scheduler -> client and
back for its result: ~15 ms each way on a busy two-core machine, more than a
short segment takes. The driver instead keeps one runner per trial slot on
every worker and calls it directly (a Dask actor call goes from the client to
the worker and back, ~1 ms), much as Ray Tune keeps an actor per trial. A
runner runs its calls one at a time, in its own thread, so a worker holding k
slots runs k segments at once; its trainables stay parked on the worker
between segments (:mod:`tasks.live`).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from tasks.segment import SegmentOutcome, SegmentSpec, run_segments


class SegmentRunner:
    """Created on ``worker`` by ``client.submit(SegmentRunner, worker, actor=True)``."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="popflow-runner")

    async def run(self, specs: list[SegmentSpec]) -> list[SegmentOutcome]:
        """Run ``specs``' segments in order, off the worker's event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, run_segments, specs, self.worker)

    def __del__(self) -> None:  # the driver released the actor
        self._thread.shutdown(wait=False)
