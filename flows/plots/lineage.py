"""The best trial's lineage in a PBT plot: the results its state and config came through.

A PBT trial's line breaks at each exploit (it restored another trial's
checkpoint with an explored config), so with many exploits no single line
tells the schedule that won. Walking back from the best trial's last result,
through each exploit that led into the segment at hand (the ``pbt_global.txt``
entries, matched to results by :mod:`popflow.flows.plots.data`), gives one path:
the source's results up to the point it was cloned at, then the clone's; its
config values over time are the schedule that produced the best result
(pure: results in, pieces out).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: A trial's results, in the segments its line is broken into.
Segments = Sequence[Sequence[Mapping[str, Any]]]


@dataclass(frozen=True)
class Entry:
    """An exploit into a trial: the index of the segment that starts after it (None: no
    result of the clone yet), the source trial and the source's result it cloned."""

    segment: int | None
    source: str
    source_result: Mapping[str, Any] | None


def best_trial(
    histories: Mapping[str, Sequence[Mapping[str, Any]]], metric: str, mode: str | None
) -> str | None:
    """The trial whose last result with a finite ``metric`` is the best (None: no mode, or
    no such result)."""
    if mode not in ("max", "min"):
        return None
    last: dict[str, float] = {}
    for trial, history in histories.items():
        for result in reversed(history):
            value = result.get(metric)
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if number and math.isfinite(value):
                last[trial] = float(value)
                break
    if not last:
        return None
    pick = max if mode == "max" else min
    return pick(last, key=last.__getitem__)


def lineage(
    best: str, segments: Mapping[str, Segments], entries: Mapping[str, Sequence[Entry]]
) -> list[tuple[str, list[Mapping[str, Any]]]]:
    """The pieces of the path that led to ``best``'s last result, oldest first: each a
    trial and the results of it on the path (a whole segment, or a segment up to the
    result cloned from it)."""
    mine = segments.get(best) or []
    k = max((i for i, seg in enumerate(mine) if seg), default=None)
    trial, upto = best, None
    pieces: list[tuple[str, list[Mapping[str, Any]]]] = []
    guard = sum(len(s) for s in segments.values()) + 1  # each segment once at most
    while k is not None and guard > 0:
        guard -= 1
        segment = list(segments[trial][k])
        pieces.append((trial, segment if upto is None else segment[: upto + 1]))
        into = next((e for e in entries.get(trial, ()) if e.segment == k), None)
        if into is None:  # its first segment, or a break where time went back (a restore)
            k, upto = (k - 1, None) if k > 0 else (None, None)
            continue
        k, upto = _find(segments.get(into.source) or [], into.source_result)
        trial = into.source
    pieces.reverse()
    return [(t, results) for t, results in pieces if results]


def _find(segments: Segments, result: Mapping[str, Any] | None) -> tuple[int | None, int | None]:
    """(segment, index) of ``result`` (the very object) in ``segments``; (None, None)."""
    for k, segment in enumerate(segments):
        for i, r in enumerate(segment):
            if r is result:
                return k, i
    return None, None
