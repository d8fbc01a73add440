"""How segments are packed into runner calls.

A runner call costs CPU on the driver and on the worker, and its round trip
more on a loaded machine: ``benchmarks/bookkeeping.py``'s many short trials, a
call each, kept the cores busy and left slots waiting for their next call.
Asynchronous dispatch packs segments measured shorter than
``PACK_BELOW_SECONDS`` into one call, up to that much work per call; and a
call only holds trials whose trainables are parked on one worker (the call
goes there). Results come back a call at a time, so a packed segment's result
waits for its call's others: at most ``PACK_BELOW_SECONDS``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection

from popflow.flows.experiment.trial_table import TrialRecord

#: chosen on benchmarks/bookkeeping.py's short trials: a threshold of their own length
#: packed none of them
PACK_BELOW_SECONDS = 0.2


def pack_size(segment_seconds: float | None, unfinished: int, slots: int) -> int:
    """How many segments one asynchronous runner call carries.

    1 until segments are measured (``segment_seconds``, a moving average)
    shorter than ``PACK_BELOW_SECONDS``; then enough to reach it, but never so
    many that a slot would lack its two queued calls (every ``unfinished``
    trial in flight at most).
    """
    if segment_seconds is None or segment_seconds >= PACK_BELOW_SECONDS:
        return 1
    want = math.ceil(PACK_BELOW_SECONDS / max(segment_seconds, 1e-4))
    return max(1, min(want, math.ceil(unfinished / (2 * slots))))


def packs(
    recs: list[TrialRecord], size: int, alone: Collection[str] = ()
) -> list[list[TrialRecord]]:
    """Split ``recs`` into runner calls of up to ``size``: trials parked on one worker
    together, trials without a live trainable filling the gaps; trials in ``alone``
    (suspected of taking a worker process down) in a call of their own each."""
    by_worker: dict[str, list[TrialRecord]] = {}
    cold: list[TrialRecord] = []
    singles: list[list[TrialRecord]] = []
    for rec in recs:
        if rec.trial_id in alone:
            singles.append([rec])
        elif rec.live:
            by_worker.setdefault(rec.live[1], []).append(rec)
        else:
            cold.append(rec)
    # each worker's first pack, then its second, ...: a pack that its worker's runner
    # already has one ahead of it may go to an idle runner (see Controller._dispatch)
    groups = [[g[i : i + size] for i in range(0, len(g), size)] for g in by_worker.values()]
    out = [pack for row in itertools.zip_longest(*groups) for pack in row if pack]
    for pack in out:
        while cold and len(pack) < size:
            pack.append(cold.pop(0))
    out += [cold[i : i + size] for i in range(0, len(cold), size)]
    return out + singles


def spread(calls: list[list[TrialRecord]], slots: int) -> list[list[TrialRecord]]:
    """``calls`` split until every one of ``slots`` has a call, or each holds one trial: the
    largest call is halved first, so no call grows and the slowest slot's work does not
    either. A synchronous round's packs are cut by the slots the round began with, trials
    parked on one worker together; a worker that joined since (another host) would get
    none of them (a half that queues behind its other half on their worker goes to an
    idle runner, :meth:`~popflow.flows.driver.backend.Backend.place`)."""
    out = [list(c) for c in calls]
    while len(out) < slots:
        largest = max(range(len(out)), key=lambda i: len(out[i]), default=None)
        if largest is None or len(out[largest]) < 2:
            break
        call = out[largest]
        half = len(call) // 2
        out[largest : largest + 1] = [call[: len(call) - half], call[len(call) - half :]]
    return out
