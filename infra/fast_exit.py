"""A process that ran popflow exits without CPython's teardown collections.

While CPython tears an interpreter down it runs the cyclic garbage collector
over every tracked object several times (once after the ``atexit`` handlers,
then again as it clears ``sys.modules`` and the modules' dicts). With Prefect,
Dask and pydantic imported each pass traverses every object they keep alive, on
every script, after its last result is in.

:func:`skip_teardown_collections` registers one ``atexit`` handler. It runs one
ordinary full collection first, so what is already unreachable is finalised
as any collection would, then ``gc.freeze()``: the teardown's passes skip what
is left. What changes is only what would have become unreachable during the
teardown itself (an object reachable only through a module's class or another
cycle that the teardown breaks): Python does not promise to finalise that
either ("It is not guaranteed that __del__() methods are called for objects
that still exist when the interpreter exits"), so close files rather than
count on it.
"""

from __future__ import annotations

import atexit
import gc

_registered = False


def skip_teardown_collections() -> None:
    """Register the exit handler (once per process; later calls do nothing)."""
    global _registered
    if _registered:
        return
    _registered = True
    atexit.register(_freeze_at_exit)


def _freeze_at_exit() -> None:
    gc.collect()  # what is garbage now is finalised, as at any collection
    gc.freeze()  # what is alive now is left to the OS, not traversed by the teardown's passes
