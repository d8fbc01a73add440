"""The segment runner: a Dask actor that runs segments on its worker.

A Dask task goes client -> scheduler -> worker -> scheduler -> client and
back for its result: ~15 ms each way on a busy two-core machine, more than a
short segment takes. The driver instead keeps one runner per trial slot on
every worker and calls it directly (a Dask actor call goes from the client to
the worker and back, ~1 ms), much as Ray Tune keeps an actor per trial. A
runner runs its calls one at a time, in its own thread, so a worker holding k
slots runs k segments at once; its trainables stay parked on the worker
between segments (:mod:`popflow.tasks.live`).
"""

from __future__ import annotations

import asyncio
import os
import pickle
from concurrent.futures import ThreadPoolExecutor

import cloudpickle

from popflow.tasks.segment import run_segments
from popflow.tasks.specs import SegmentOutcome, SegmentSpec


class SpecsUnreadable(RuntimeError):
    """A call's segment specs cannot be unpickled on this worker (e.g. a module it lacks)."""


class SegmentRunner:
    """Created on ``worker`` by ``client.submit(SegmentRunner, worker, actor=True)``."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="popflow-runner")

    async def run(self, blob: bytes) -> list[SegmentOutcome]:
        """Run the segments pickled in ``blob`` (:func:`pack_specs`) in order, off the
        worker's event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._run, blob)

    def _run(self, blob: bytes) -> list[SegmentOutcome]:
        try:
            specs: list[SegmentSpec] = pickle.loads(blob)
        except Exception as exc:  # not this worker's fault: the driver retries, then errors
            hint = (
                '; a script without `if __name__ == "__main__":` is not run on the '
                "workers: move what its trainable refers to by name into a module, or "
                "add the guard"
                if "__main__" in str(exc)
                else ""
            )
            raise SpecsUnreadable(
                f"cannot unpickle the segments: {type(exc).__name__}: {exc}{hint}"
            ) from None
        return run_segments(specs, self.worker)

    def __del__(self) -> None:  # the driver released the actor
        self._thread.shutdown(wait=False)


def pack_specs(specs: list[SegmentSpec]) -> bytes:
    """Pickle a call's specs on the driver; the worker unpickles them inside the call,
    so that a failure comes back as an error of the call, not of the connection.

    Plain pickle when it can (30x faster); cloudpickle for a trainable from
    ``__main__`` or from a module registered to travel by value (plain pickle
    would send it by name, which the worker may not import), and for what
    plain pickle cannot take (a lambda as stop condition).
    """
    by_value = {"__main__", *cloudpickle.list_registry_pickle_by_value()}
    if not any(getattr(spec.trainable, "__module__", None) in by_value for spec in specs):
        try:
            blob = pickle.dumps(specs)
        except Exception:  # lambdas, closures, objects of __main__
            pass
        else:
            if b"__main__" not in blob:
                return blob
    return cloudpickle.dumps(specs)


async def exit_worker_process() -> None:
    """End this worker's process at once (``Client.run``): a segment that hangs in user
    code cannot be interrupted any other way. The nanny starts the worker again."""
    os._exit(70)
