"""The state of the newest commit, kept as JSON text: what makes a commit of a large
trial table cost what its round changed.

A commit is a delta from the state before it, or now and then the whole state
(a snapshot; :mod:`popflow.infra.store.commit_log`). With a large population, parsing and
encoding the whole table each time took most of a commit: here the large parts
(the trial table, the derived logs' sizes) are kept item by item as JSON text, and an
item that is a dict (a trial's row) field by field. A round's changed items
(:class:`~popflow.infra.store.json_delta.Changed`) are encoded, their fields compared with
the old texts, and only the fields that differ are parsed and diffed; a list field
that only grew (a trial's checkpoints) parses just its new items. A snapshot joins
the texts without encoding anything again.

    >>> state = StateText(("trials", "round"), {"trials": [{"a": 1}, {"a": 2}], "round": 1})
    >>> new, delta = state.update({"trials": Changed({1: {"a": 3}}), "round": 2})
    >>> delta
    {'d': {'trials': {'i': {'1': {'d': {'a': {'v': 3}}}}}, 'round': {'v': 2}}}
    >>> new.json()
    '{"trials": [{"a": 1}, {"a": 3}], "round": 2}'
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from popflow.infra.jsonutil import dumps
from popflow.infra.store.json_delta import Changed, Op, diff

#: The parts of a state kept item by item (a list's items, a dict's values).
ITEMIZED = frozenset({"trials", "derived"})

#: One item as text: a dict's fields (key -> JSON text), or the JSON text of anything else.
Item = dict[str, str] | str
Items = list[Item] | dict[str, Item]


def _item(value: Any) -> Item:
    if isinstance(value, dict):
        return {str(k): dumps(v) for k, v in value.items()}
    return dumps(value)


def _item_json(item: Item) -> str:
    if isinstance(item, str):
        return item
    return "{" + ", ".join(f"{json.dumps(k)}: {t}" for k, t in item.items()) + "}"


def _text_op(old: str, new: str) -> Op | None:
    """:func:`diff` of two JSON texts. A list that only grew at the end costs its new
    items: the old text is a prefix of the new one (JSON values delimit themselves)."""
    if old == new:
        return None
    if old.startswith("[") and new.startswith("["):
        if old == "[]":
            return {"a": json.loads(new)}
        head = old[:-1] + ", "
        if new.startswith(head):
            return {"a": json.loads("[" + new[len(head) :])}
    return diff(json.loads(old), json.loads(new))


def _item_op(old: Item, new: Item) -> Op | None:
    """The delta from one item to another, field by field for dicts."""
    if isinstance(old, str) or isinstance(new, str):
        return _text_op(_item_json(old), _item_json(new))
    ops: dict[str, Op] = {}
    for key, text in new.items():
        before = old.get(key)
        op = {"v": json.loads(text)} if before is None else _text_op(before, text)
        if op is not None:
            ops[key] = op
    removed = [k for k in old if k not in new]
    if not ops and not removed:
        return None
    return {"d": ops, "r": removed} if removed else {"d": ops}


class StateText:
    """A state (a dict of ``keys``) as JSON text: whole for small parts, item by item for
    the :data:`ITEMIZED` ones. Immutable: :meth:`update` returns a new one."""

    def __init__(self, keys: Sequence[str], state: Mapping[str, Any]) -> None:
        self.keys = tuple(keys)
        self._whole: dict[str, str] = {}
        self._items: dict[str, Items] = {}
        for key in self.keys:
            if key in state:
                self._set(key, state[key])

    def _set(self, key: str, value: Any) -> None:
        if isinstance(value, Changed):
            raise ValueError(f"`{key}` needs its whole value here, not its changes")
        if key in ITEMIZED and isinstance(value, list):
            self._items[key] = [_item(v) for v in value]
        elif key in ITEMIZED and isinstance(value, dict):
            self._items[key] = {str(k): _item(v) for k, v in value.items()}
        else:
            self._whole[key] = dumps(value)

    def __contains__(self, key: str) -> bool:
        return key in self._whole or key in self._items

    def part(self, key: str) -> str:
        """The JSON text of one part."""
        if key in self._whole:
            return self._whole[key]
        items = self._items[key]
        if isinstance(items, list):
            return "[" + ", ".join(_item_json(i) for i in items) + "]"
        return "{" + ", ".join(f"{json.dumps(k)}: {_item_json(i)}" for k, i in items.items()) + "}"

    def json(self) -> str:
        """The whole state as JSON text (a snapshot's)."""
        parts = (f"{json.dumps(k)}: {self.part(k)}" for k in self.keys if k in self)
        return "{" + ", ".join(parts) + "}"

    def value(self) -> dict[str, Any]:
        """The state as :func:`json.loads` reads it."""
        return json.loads(self.json())

    def update(self, given: Mapping[str, Any]) -> tuple[StateText, Op | None]:
        """The state ``given`` leaves (its parts in full, or an itemized part's
        :class:`Changed` items), and the delta from this one (:func:`diff`'s form)."""
        new = StateText(self.keys, {})
        ops: dict[str, Op] = {}
        for key in self.keys:
            if key not in given:
                continue
            value = given[key]
            if isinstance(value, Changed):
                if key not in self._items:
                    raise ValueError(f"`{key}` was not committed item by item: give it whole")
                new._items[key], op = _changed_items(self._items[key], value)
            else:
                new._set(key, value)
                op = self._op(key, new)
            if op is not None:
                ops[key] = op
        removed = [k for k in self.keys if k in self and k not in new]
        if not ops and not removed:
            return new, None
        return new, ({"d": ops, "r": removed} if removed else {"d": ops})

    def _op(self, key: str, new: StateText) -> Op | None:
        """The delta of a part given whole (rare for the itemized parts: a first commit
        after a resume), by parsing both sides."""
        if key not in self:
            return {"v": json.loads(new.part(key))}
        before, after = self.part(key), new.part(key)
        if before == after:
            return None
        return diff(json.loads(before), json.loads(after))


def _changed_items(items: Items, changed: Changed) -> tuple[Items, Op | None]:
    """``items`` with ``changed``'s set, and the delta: only what changed is parsed."""
    ops: dict[str, Op] = {}
    if isinstance(items, list):
        out_list = list(items)
        for i, value in changed.items.items():
            if not 0 <= i < len(out_list):
                raise IndexError(
                    f"item {i} of a list of {len(out_list)}: a Changed list keeps its length"
                )
            item = _item(value)
            op = _item_op(out_list[i], item)
            out_list[i] = item
            if op is not None:
                ops[str(i)] = op
        return out_list, ({"i": ops} if ops else None)
    out = dict(items)
    for raw, value in changed.items.items():
        key, item = str(raw), _item(value)
        old = out.get(key)
        op = {"v": json.loads(_item_json(item))} if old is None else _item_op(old, item)
        out[key] = item
        if op is not None:
            ops[key] = op
    return out, ({"d": ops} if ops else None)
