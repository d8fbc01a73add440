"""The segment runner: a Dask actor that runs segments on its worker.

A Dask task goes client -> scheduler -> worker -> scheduler -> client and
back for its result: on a busy machine that round trip can take longer than a
short segment trains. The driver instead keeps one runner per trial slot on
every worker and calls it directly (a Dask actor call goes from the client to
the worker and back, with no scheduler between), much as Ray Tune keeps an
actor per trial. A runner runs its calls one at a time, so a worker holding k
slots runs k segments at once; its trainables stay parked on the worker between
segments (:mod:`popflow.tasks.live`).

Each runner's slot is a Dask task, :func:`hold_slot`, which the driver submits
with the trial's resources: it holds a worker thread and those resources for as
long as the runner lives, and the runner's segments run in that thread. So Dask
counts what popflow uses (other work on a shared cluster waits for a free slot
instead of oversubscribing the worker), the dashboard shows the slots as running
``popflow-<experiment>-slot`` tasks, and its profiler sees the training code.
A GPU trial's segments run with ``CUDA_VISIBLE_DEVICES`` set to its slot's
devices (:mod:`popflow.infra.cluster.gpus`).
"""

from __future__ import annotations

import asyncio
import functools
import math
import os
import pickle
import queue
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import cloudpickle

from popflow.infra.cluster.gpus import CUDA_VISIBLE_DEVICES, slot_devices, visible_devices
from popflow.infra.storage.folder import Storage
from popflow.tasks.live import discard_parked_soon
from popflow.tasks.restore_fetch import fetch_early
from popflow.tasks.segment import run_segments, settle_deferred
from popflow.tasks.specs import Published, SegmentOutcome, SegmentSpec

#: Seconds between a holding thread's looks at whether its runner is gone.
HOLD_POLL_S = 1.0
#: The work queue of each runner on this worker, by slot token.
_SLOTS: dict[str, queue.Queue[tuple[Callable[[], Any], Future[Any]] | None]] = {}


class SpecsUnreadable(RuntimeError):
    """A call's segment specs cannot be unpickled on this worker (e.g. a module it lacks)."""


class SegmentRunner:
    """Created on ``worker`` by ``client.submit(SegmentRunner, worker, token, gpu,
    actor=True)``; its segments run in the thread of the ``hold_slot(token)`` task.

    ``gpu``: what one trial asks for (0: none); ``slot``: which of the worker's
    trial slots this runner is, which picks its devices.
    """

    def __init__(self, worker: str, token: str, slot: int = 0, gpu: float = 0.0) -> None:
        self.worker = worker
        self.token = token
        self._work = _SLOTS.setdefault(token, queue.Queue())
        self.devices = slot_devices(_worker_devices(), slot, gpu) if gpu else ()

    async def run(
        self, blob: bytes, early: Sequence[tuple[Storage, str, str]] = ()
    ) -> list[SegmentOutcome]:
        """Run the segments pickled in ``blob`` (:func:`pack_specs`) in order, in the
        slot's thread, off the worker's event loop. ``early``: checkpoints (storage,
        path, version) they restore from, to download now: the call waits behind
        another (:func:`popflow.tasks.restore_fetch.fetch_early`)."""
        for storage, rel_path, digest in early:
            fetch_early(storage, rel_path, digest)
        done: Future[list[SegmentOutcome]] = Future()
        self._work.put((functools.partial(self._run, blob), done))
        return await asyncio.wrap_future(done)

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
        if self.devices:
            os.environ[CUDA_VISIBLE_DEVICES] = ",".join(self.devices)
        return run_segments(specs, self.worker)

    async def settle(self, token: str) -> Published:
        """What the publishes a deferred call left running came to, once they end (waited
        for in a thread of its own: this runner's slot trains meanwhile)."""
        return await asyncio.to_thread(settle_deferred, token)

    async def discard(self, tokens: list[str]) -> None:
        """Drop trainables parked on this worker (in a thread of its own: a slow
        ``cleanup()`` never blocks the worker's event loop)."""
        await discard_parked_soon(tokens)

    async def exit_process(self) -> None:
        """End this worker's process at once: a segment that hangs in user code cannot be
        interrupted any other way. The nanny starts the worker again."""
        os._exit(70)

    def close(self) -> None:
        """End the slot: its ``hold_slot`` task returns (after the segment it runs)."""
        work = _SLOTS.pop(self.token, None)
        if work is not None:
            work.put(None)

    def __del__(self) -> None:  # the driver released the actor without closing it
        self.close()


def hold_slot(token: str) -> str:
    """A Dask task holding one trial slot: it runs runner ``token``'s segments in its
    thread until the runner is released (its ``__del__``), or until Dask cancels it
    (the driver is gone)."""
    from distributed import get_worker

    work = _SLOTS.setdefault(token, queue.Queue())
    worker = get_worker()
    key = worker.get_current_task()
    while True:
        try:
            item = work.get(timeout=HOLD_POLL_S)
        except queue.Empty:
            task = worker.state.tasks.get(key)
            if token not in _SLOTS or task is None or task.state == "cancelled":
                _SLOTS.pop(token, None)
                return token
            continue
        if item is None:
            return token
        fn, done = item
        if done.set_running_or_notify_cancel():
            try:
                done.set_result(fn())
            except BaseException as exc:  # handed to the caller, as a call's own error
                done.set_exception(exc)


def _worker_devices() -> list[str]:
    """This worker's GPUs: its ``CUDA_VISIBLE_DEVICES`` (pinned by the embedded cluster,
    or by the user), else as many as its ``GPU`` resource."""
    from distributed import get_worker

    offered = get_worker().state.total_resources.get("GPU", 0)
    return visible_devices(math.ceil(offered))


def pack_specs(specs: list[SegmentSpec]) -> bytes:
    """Pickle a call's specs on the driver; the worker unpickles them inside the call,
    so that a failure comes back as an error of the call, not of the connection.

    Plain pickle when it can (faster: cloudpickle calls back into Python for each
    object); cloudpickle for a trainable from ``__main__`` or from a module
    registered to travel by value (plain pickle would send it by name, which the
    worker may not import), and for what plain pickle cannot take (a lambda as
    stop condition).
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


def early_restores(specs: list[SegmentSpec]) -> list[tuple[Storage, str, str]]:
    """The checkpoint versions ``specs`` restore from an object store, for a call queued
    behind another to download when it reaches its worker (:meth:`SegmentRunner.run`).
    A trial with a trainable parked somewhere is left out: it usually continues it."""
    return [
        (spec.storage, spec.restore, spec.restore_digest)
        for spec in specs
        if spec.restore is not None
        and spec.restore_digest is not None
        and spec.live_token is None
        and not spec.storage.is_local
    ]
