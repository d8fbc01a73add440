"""The driver's helper threads, or none: where background work runs.

The driver hands some work to threads of its own: the derived logs' writer
(:mod:`popflow.flows.experiment.trial_logs`), the deletion of retired checkpoints
(:mod:`popflow.flows.driver.retention`) and checkpoint transfers
(:mod:`popflow.tasks.uploads`). Each gets its executor from :func:`helper_pool`.

A deterministic simulation (:mod:`popflow.flows.simulation`) runs that work inline
instead, in the thread that hands it over, at the moment it is handed over: then the
storage calls of one driver come in one order, the same on every run, and a seed that
chooses a fault at a storage call replays exactly. ``with inline_helpers(): ...``
says so for the current thread (a context variable: drivers simulated in other
threads are not affected).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")

_inline: ContextVar[bool] = ContextVar("popflow_inline_helpers", default=False)


class InlineExecutor(Executor):
    """Runs each submitted call at once, in the caller's thread; its future is done
    when ``submit`` returns (an exception, of any kind, is the future's)."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # as a pool's worker does: the caller sees it
            future.set_exception(exc)
        return future


def helpers_inline() -> bool:
    """Whether this thread runs helper work inline (:func:`inline_helpers`)."""
    return _inline.get()


def helper_pool(max_workers: int, name: str) -> Executor:
    """A pool of ``max_workers`` threads named ``name``, or an :class:`InlineExecutor`
    under :func:`inline_helpers`."""
    if _inline.get():
        return InlineExecutor()
    return ThreadPoolExecutor(max_workers, thread_name_prefix=name)


@contextmanager
def inline_helpers() -> Iterator[None]:
    """Helper work handed over in this thread, within the block, runs inline."""
    token = _inline.set(True)
    try:
        yield
    finally:
        _inline.reset(token)
