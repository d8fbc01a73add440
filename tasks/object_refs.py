"""Ray's ``ray.put`` / ``ray.get``: object references that travel in a config by name.

``put(value)`` pickles ``value`` once (as Ray serializes it at ``put``: later changes
to the object are not seen) and returns an :class:`ObjectRef`. A ref is a string,
``popflow-ref:<32 hex>``: it hashes, compares, goes into ``grid_search`` and into
the committed config as that name, and pickles as that name. The bytes stay in
the process that put them; a run publishes them on its Dask cluster once its
client exists (:mod:`popflow.flows.api.object_refs`), each under a Dask dataset
named by the ref, and ``get`` on a worker fetches them from there. ``get`` returns
a fresh copy each time (unpickled from the bytes), as Ray's does, so a trial that
trains the model it got changes no other trial's.

A committed config reads back with the ref's name as a plain string:
:func:`as_object_refs` makes refs of such strings again before a trainable sees
its config.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Mapping
from typing import Any

import cloudpickle

#: What a ref's name starts with; the rest is 32 hex digits.
PREFIX = "popflow-ref:"
_NAME = re.compile(re.escape(PREFIX) + r"[0-9a-f]{32}")


class ObjectRefMissing(LookupError):
    """The value of an :class:`ObjectRef` is nowhere this process can reach: not put
    here, and not published on the cluster (refs do not outlive the process that put
    them; a resumed run must be given new ones)."""


class ObjectRef(str):
    """Ray's ``ObjectRef``: the name of a value :func:`put` stored; :func:`get` reads it."""

    __slots__ = ()

    def __new__(cls, name: str) -> ObjectRef:
        if not is_ref_name(name):
            raise ValueError(f"{name!r} is not an object ref's name ({PREFIX}<32 hex digits>)")
        return super().__new__(cls, name)

    def hex(self) -> str:
        """Ray's ``ObjectRef.hex()``: the ref's id."""
        return self[len(PREFIX) :]

    def __repr__(self) -> str:
        return f"ObjectRef({self.hex()})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (ObjectRef, (str(self),))  # the name only: never the value

    def __copy__(self) -> ObjectRef:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> ObjectRef:
        return self


def is_ref_name(value: Any) -> bool:
    """``value`` is a string that names an object ref (a ref, or its committed form)."""
    return isinstance(value, str) and _NAME.fullmatch(value) is not None


#: What this process holds, by ref name: the pickled value (put here, or bound to a
#: resumed run's refs by the driver).
_HELD: dict[str, bytes] = {}
#: What this worker fetched from the cluster, by the Dask key published under the name
#: (a resumed run may publish a name again with other bytes: its key is new).
_FETCHED: dict[str, bytes] = {}
_LOCK = threading.Lock()


def put(value: Any) -> ObjectRef:
    """Ray's ``ray.put``: store ``value`` (pickled now) and return its ref."""
    if isinstance(value, ObjectRef):
        raise TypeError(
            "Calling 'put' on an ObjectRef is not allowed; wrap it in a list to store it"
        )
    ref = ObjectRef(PREFIX + uuid.uuid4().hex)
    data = cloudpickle.dumps(value)
    with _LOCK:
        _HELD[ref] = data
    return ref


def get(refs: ObjectRef | list[ObjectRef], *, timeout: float | None = None) -> Any:
    """Ray's ``ray.get``: the value of a ref, or a list of values for a list of refs."""
    if isinstance(refs, list):
        for ref in refs:
            if not isinstance(ref, ObjectRef):
                raise TypeError(f"Attempting to call `get` on the value {ref!r}, not an ObjectRef")
        return [cloudpickle.loads(_bytes_of(ref, timeout)) for ref in refs]
    if not isinstance(refs, ObjectRef):
        raise ValueError(
            f"Invalid type of object refs, {type(refs)}, is given. "
            "'object_refs' must either be an ObjectRef or a list of ObjectRefs."
        )
    return cloudpickle.loads(_bytes_of(refs, timeout))


def _bytes_of(ref: ObjectRef, timeout: float | None) -> bytes:
    with _LOCK:
        data = _HELD.get(ref)
    if data is not None:
        return data
    client = _worker_client()
    if client is None:
        raise ObjectRefMissing(
            f"object {ref!r} is not in this process: it was not put here, or "
            "popflow.shutdown() dropped it (refs do not outlive their process)"
        )
    future = client.get_dataset(str(ref), default=None)
    if future is None:
        raise ObjectRefMissing(
            f"object {ref!r} is not on the cluster: the run that uses it did not get its "
            "value (put in another process, or in one that ended; a resumed run needs new "
            "refs through Tuner.restore(param_space=...))"
        )
    with _LOCK:
        data = _FETCHED.get(future.key)
    if data is None:
        data = future.result(timeout=timeout)
        with _LOCK:
            _FETCHED[future.key] = data
    return data


def _worker_client() -> Any:
    """The client of the Dask worker in this process (None: not a worker's process)."""
    try:
        from distributed import Worker, get_worker
    except ImportError:
        return None
    try:
        worker = get_worker()
    except ValueError:  # a function trainable runs in a thread of its own, outside the task
        workers = list(Worker._instances)
        if len(workers) != 1:
            return None
        worker = workers[0]
    return worker._get_client()


def as_object_refs(config: Any) -> Any:
    """``config`` with every string that names a ref made a ref again (a committed
    config reads back with plain strings); ``config`` itself if it holds none."""
    if is_ref_name(config):
        return config if isinstance(config, ObjectRef) else ObjectRef(config)
    if type(config) is dict:
        new = {k: as_object_refs(v) for k, v in config.items()}
        return config if all(new[k] is v for k, v in config.items()) else new
    if type(config) in (list, tuple):
        items = [as_object_refs(v) for v in config]
        unchanged = all(a is b for a, b in zip(items, config, strict=True))
        return config if unchanged else type(config)(items)
    return config


def ref_names(config: Any) -> set[str]:
    """The ref names anywhere in ``config`` (dicts, lists and tuples)."""
    if is_ref_name(config):
        return {str(config)}
    if isinstance(config, Mapping):
        return set().union(*(ref_names(v) for v in config.values()))
    if type(config) in (list, tuple):
        return set().union(*(ref_names(v) for v in config))
    return set()


def held() -> dict[str, bytes]:
    """A copy of what this process holds, by ref name."""
    with _LOCK:
        return dict(_HELD)


def bind(name: str, data: bytes) -> None:
    """Hold ``data`` under ``name`` (a resumed run's old ref, given a new ref's value)."""
    with _LOCK:
        _HELD[name] = data


def drop_all() -> None:
    """Forget every value held here (Ray's ``shutdown`` frees its object store)."""
    with _LOCK:
        _HELD.clear()
        _FETCHED.clear()
