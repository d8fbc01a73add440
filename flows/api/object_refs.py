"""The driver's side of ``ray.put`` / ``ray.get``: a run's object refs on its cluster,
and a resumed run's refs bound again (``ray.shutdown``: :mod:`popflow.flows.api.session`).

``put`` may come before any Dask client exists (the embedded cluster starts inside
the run), so the values wait in the driver (:mod:`popflow.tasks.object_refs`) and
:func:`objects_on_cluster` scatters them once the run's client is there: each value
once, published as a Dask dataset under the name of every ref that means it, taken
back when the run ends.

A ref's committed form is its name: its value is never in storage. Ray's
``Tuner.restore(path, trainable, param_space=...)`` gives a resumed run new refs
for the old (the guide's "re-specify the param_space to update the object
references"): the refs are paired by where they stand in the ``param_space`` the
experiment started with (``run_args.json``) and in the new one, and each old name
is bound to its new ref's value in this process, so the committed configs keep
their names. A ref a trial still needs and that nothing binds stops the run at
once, naming it, where it stood and the trials that hold it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from distributed import Client

from popflow.flows.spec.args_codec import REF_KIND, TAG, Encoder
from popflow.infra.storage.folder import Storage
from popflow.infra.store.layout import RUN_ARGS_FILE
from popflow.tasks.object_refs import (
    ObjectRef,
    ObjectRefMissing,
    bind,
    get,
    held,
    put,
    ref_names,
)

__all__ = [
    "ObjectRef",
    "ObjectRefMissing",
    "get",
    "objects_on_cluster",
    "put",
]

logger = logging.getLogger(__name__)


@contextmanager
def objects_on_cluster(
    client: Client, param_space: dict[str, Any], records: list[Any], storage: Storage, resumed: bool
) -> Iterator[None]:
    """While inside, the workers of ``client`` can ``get`` every ref put in this process
    and every ref the live trials of ``records`` hold. ``resumed``: the experiment was
    resumed, and its old refs are bound to those of ``param_space`` by position."""
    needed = _needed(records)
    if resumed and needed:
        _bind_resumed(param_space, storage)
    values = held()
    missing = sorted(needed - set(values))
    if missing:
        raise ObjectRefMissing(_missing_text(missing, records, storage))
    if not values:
        yield
        return
    scheduler = client.scheduler.address
    futures: dict[int, Any] = {}  # id of the bytes -> their future: each value sent once
    published: list[str] = []
    try:
        for name, data in values.items():
            future = futures.get(id(data))
            if future is None:
                future = futures[id(data)] = client.scatter(data, hash=False)
            client.publish_dataset(future, name=name, override=True)
            published.append(name)
            with _LOCK:
                _PUBLISHED[scheduler, name] = _PUBLISHED.get((scheduler, name), 0) + 1
        logger.debug("%d object refs published on the cluster", len(published))
        yield
    finally:
        with _LOCK:  # another run of this process on the cluster may still use a name
            done = [n for n in published if _release(scheduler, n)]
        try:
            if done and client.status == "running":
                client.unpublish_dataset(done)
        except Exception as e:  # the cluster is going or gone: the data with it
            logger.debug("could not take the object refs back: %s", e)


#: How many runs of this process have published a name, by (scheduler, name).
_PUBLISHED: dict[tuple[str, str], int] = {}
_LOCK = threading.Lock()


def _release(scheduler: str, name: str) -> bool:
    """One run is done with ``name``: whether none is left that published it."""
    left = _PUBLISHED.pop((scheduler, name), 1) - 1
    if left:
        _PUBLISHED[scheduler, name] = left
    return not left


def _needed(records: list[Any]) -> set[str]:
    """The refs the trials that may still run hold in their configs."""
    return set().union(*(ref_names(r.trial.config) for r in records if r.trial.is_live))


def _bind_resumed(param_space: dict[str, Any], storage: Storage) -> None:
    """Bind each ref of the experiment's first ``param_space`` to the value of the ref
    that stands where it stood in ``param_space`` (a resumed run's own)."""
    old = _started_space(storage)
    if old is None:
        return
    new = Encoder().encode(param_space, "param_space")
    values = held()
    for old_name, new_name, _where in _pairs(old, new, "param_space"):
        if old_name != new_name and new_name in values:
            bind(old_name, values[new_name])


def _started_space(storage: Storage) -> Any:
    """The ``param_space`` the experiment started with, as ``run_args.json`` encodes it
    (None: not kept there)."""
    try:
        record = json.loads(storage.read_text(RUN_ARGS_FILE))
    except (FileNotFoundError, ValueError):
        return None
    args = record.get("args") if isinstance(record, dict) else None
    return args.get("param_space") if isinstance(args, dict) else None


def _ref_name(encoded: Any) -> str | None:
    if isinstance(encoded, dict) and encoded.get(TAG) == REF_KIND:
        name = encoded.get("name")
        return name if isinstance(name, str) else None
    return None


def _pairs(old: Any, new: Any, where: str) -> Iterator[tuple[str, str | None, str]]:
    """(old ref, the ref at its place in ``new`` or None, where) for every ref in the
    encoded ``old``."""
    name = _ref_name(old)
    if name is not None:
        yield name, _ref_name(new), where
    elif isinstance(old, dict):
        for key, value in old.items():
            there = new.get(key) if isinstance(new, dict) else None
            yield from _pairs(value, there, f"{where}[{key!r}]")
    elif isinstance(old, list):
        for i, value in enumerate(old):
            there = new[i] if isinstance(new, list) and i < len(new) else None
            yield from _pairs(value, there, f"{where}[{i}]")


def _missing_text(missing: list[str], records: list[Any], storage: Storage) -> str:
    old = _started_space(storage)
    places = {name: where for name, _new, where in _pairs(old, None, "param_space")}
    lines = []
    for name in missing:
        trials = [
            r.trial_id for r in records if r.trial.is_live and name in ref_names(r.trial.config)
        ]
        place = f" (at {places[name]})" if name in places else ""
        lines.append(f"  {ObjectRef(name)!r}{place}, in the config of trials {', '.join(trials)}")
    return (
        f"{len(missing)} object ref(s) the experiment's trials need are not in this process:\n"
        + "\n".join(lines)
        + "\nObject refs do not outlive the process that put them: put the objects again and "
        "give the new refs where the old ones stood, as Ray's guide does: "
        "Tuner.restore(path, trainable, param_space={...new refs...})"
    )
