"""The difference between two JSON values, and applying it: what makes commits incremental.

:func:`diff` describes how ``new`` differs from ``old`` in terms of what a
trial table changes between rounds: a few fields of a few trials, lists that
grew at the end (checkpoints, lineage, rungs). Its size is proportional to
what changed, not to the values. :func:`patch` applies it::

    >>> old = {"trials": [{"status": "RUNNING", "checkpoints": [1, 2]}], "round": 3}
    >>> new = {"trials": [{"status": "PAUSED", "checkpoints": [1, 2, 3]}], "round": 4}
    >>> delta = diff(old, new)
    >>> delta
    {'d': {'trials': {'i': {'0': {'d': {'status': {'v': 'PAUSED'}, 'checkpoints': {'a': [3]}}}}}, 'round': {'v': 4}}}
    >>> patch(old, delta) == new
    True

An operation is a dict with one tag: ``v`` (the new value), ``a`` (items
appended to a list), ``i`` (operations on some items of a list of the same
length, by index), ``d`` (operations on some keys of a dict; ``r`` lists the
keys removed). Values are those of :func:`json.loads`; :func:`patch` never
changes its input.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Op = dict[str, Any]


@dataclass(frozen=True)
class Changed:
    """A large list or dict given by its changed items only: ``items`` maps a list's
    indexes (its length stays) or a dict's keys (new ones are added) to their new values.

    A commit of a 10,000-trial table that changed 100 rows costs 100 rows this way
    (:class:`~popflow.infra.store.state_text.StateText`), not a walk over all of them.
    """

    items: Mapping[Any, Any]


def diff(old: Any, new: Any) -> Op | None:
    """The operation that turns ``old`` into ``new``; None if they are equal."""
    if type(old) is not type(new):
        return {"v": new}
    if isinstance(new, dict):
        ops = {k: op for k, v in new.items() if (op := _changed(old, k, v)) is not None}
        removed = [k for k in old if k not in new]
        if not ops and not removed:
            return None
        return {"d": ops, "r": removed} if removed else {"d": ops}
    if isinstance(new, list):
        n = len(old)
        if len(new) > n and new[:n] == old:
            return {"a": new[n:]}
        if len(new) == n:
            changed = {str(i): op for i in range(n) if (op := diff(old[i], new[i])) is not None}
            return {"i": changed} if changed else None
        return {"v": new}
    return None if old == new else {"v": new}


def _changed(old: dict[str, Any], key: str, value: Any) -> Op | None:
    if key not in old:
        return {"v": value}
    before = old[key]
    if before is value or (before == value and type(before) is type(value)):
        return None
    return diff(before, value)


def patch(old: Any, op: Op | None) -> Any:
    """``old`` with ``op`` (from :func:`diff`) applied; ``old`` is not changed."""
    if op is None:
        return old
    if "v" in op:
        return op["v"]
    if "a" in op:
        return [*old, *op["a"]]
    if "i" in op:
        out = list(old)
        for i, item in op["i"].items():
            out[int(i)] = patch(out[int(i)], item)
        return out
    out = {k: v for k, v in old.items() if k not in op.get("r", ())}
    for k, item in op["d"].items():
        out[k] = patch(out.get(k), item)
    return out
