"""A run's arguments as JSON: plain values as they are, popflow's objects by name and
constructor arguments, and everything else as a reference into a pickle.

What JSON says is data: reading it back imports only what it names by import
path (a trainable, a scheduler class, a module-level function) and builds
popflow's own objects through their constructors, which check their arguments.
What it cannot say (a lambda, a closure, an object of the user's own, a
trainable defined in ``__main__``) becomes ``{"$popflow": "pickled", "index": i}``,
and the caller pickles those *leaves* together (:mod:`popflow.flows.spec.run_args`).

Tagged values (``{"$popflow": kind, ...}``):

- ``tuple`` and ``dict`` (a dict whose keys are not all strings): ``items``;
- ``domain``: a search space of :mod:`popflow.schedulers.domains`, by class name
  and ``fields``;
- ``object``: a scheduler (a :class:`TrialScheduler` subclass, its constructor
  arguments read back from its attributes and checked to rebuild it) or a
  :class:`CheckpointConfig`, by ``class`` path and ``kwargs``;
- ``import``: a function or class found again by its ``path``;
- ``with_parameters``: a :func:`~popflow.tasks.parameters.with_parameters`
  trainable: the ``trainable`` it wraps and the ``paths`` of its stored objects;
- ``object_ref``: a ``popflow.put`` ref, by its ``name`` (never its value);
- ``pickled``: the ``index`` of a leaf.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from popflow.flows.spec.config import CheckpointConfig
from popflow.flows.spec.trainable_paths import ImportFailed, import_path, path_of
from popflow.schedulers import TrialScheduler, domains
from popflow.tasks.object_refs import ObjectRef
from popflow.tasks.parameters import parameters_of, with_stored_parameters, wrapped_trainable

TAG = "$popflow"
REF_KIND = "object_ref"
_CHECKPOINT_CONFIG = "popflow.flows.spec.config:CheckpointConfig"


class ArgsDecodeError(ValueError):
    """A stored value cannot be read back (garbled, or of a shape popflow never writes)."""


def _is_plain(obj: Any) -> bool:
    return obj is None or type(obj) in (bool, int, float, str)


def _is_search_space(obj: Any) -> bool:
    """One of popflow's own search spaces (not a subclass of the user's)."""
    return isinstance(obj, domains.Domain) and getattr(domains, type(obj).__name__, None) is type(
        obj
    )


class Encoder:
    """Encodes values; :attr:`leaves` are what JSON cannot say, :attr:`where` where each was."""

    def __init__(self) -> None:
        self.leaves: list[Any] = []
        self.where: list[str] = []
        self._index: dict[int, int] = {}  # id -> leaf index: one object pickled once

    def encode(self, obj: Any, where: str) -> Any:
        try:
            return self._encode(obj, where)
        except RecursionError:  # a structure that contains itself
            return self._leaf(obj, where)

    def _leaf(self, obj: Any, where: str) -> dict[str, Any]:
        index = self._index.get(id(obj))
        if index is None:
            index = self._index[id(obj)] = len(self.leaves)
            self.leaves.append(obj)
            self.where.append(where)
        return {TAG: "pickled", "index": index}

    def _encode(self, obj: Any, where: str) -> Any:
        if _is_plain(obj):
            return obj
        if isinstance(obj, ObjectRef):
            return {TAG: REF_KIND, "name": str(obj)}
        if type(obj) is list:
            return [self._encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        if type(obj) is tuple:
            return {
                TAG: "tuple",
                "items": [self._encode(v, f"{where}[{i}]") for i, v in enumerate(obj)],
            }
        if type(obj) is dict:
            if all(type(k) is str for k in obj) and TAG not in obj:
                return {k: self._encode(v, f"{where}[{k!r}]") for k, v in obj.items()}
            if all(_is_plain(k) for k in obj):
                items = [[k, self._encode(v, f"{where}[{k!r}]")] for k, v in obj.items()]
                return {TAG: "dict", "items": items}
            return self._leaf(obj, where)
        if _is_search_space(obj):
            fields = {
                f.name: self._encode(getattr(obj, f.name), f"{where}.{f.name}")
                for f in dataclasses.fields(obj)
                if f.init
            }
            return {TAG: "domain", "class": type(obj).__name__, "fields": fields}
        if type(obj) is CheckpointConfig:
            kwargs = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
            return {
                TAG: "object",
                "class": _CHECKPOINT_CONFIG,
                "kwargs": self._encode(kwargs, where),
            }
        if isinstance(obj, TrialScheduler):
            return self._scheduler(obj, where)
        params = parameters_of(obj)
        if params is not None and params.paths is not None:
            return {
                TAG: "with_parameters",
                "trainable": self._encode(wrapped_trainable(obj), where),
                "paths": dict(params.paths),
            }
        if inspect.isfunction(obj) or inspect.isclass(obj):
            path = path_of(obj)
            if path is not None:
                return {TAG: "import", "path": path}
        return self._leaf(obj, where)

    def _scheduler(self, scheduler: TrialScheduler, where: str) -> Any:
        cls = type(scheduler)
        path = path_of(cls)
        kwargs = constructor_arguments(scheduler)
        if path is None or kwargs is None:
            return self._leaf(scheduler, where)
        encoded = {k: self._encode(v, f"{where}.{k}") for k, v in kwargs.items()}
        return {TAG: "object", "class": path, "kwargs": encoded}


def constructor_arguments(scheduler: TrialScheduler) -> dict[str, Any] | None:
    """The keyword arguments that build ``scheduler`` again (its ``init_args`` by name,
    with the metric and mode it has now: ``run`` may have set them); None when they
    cannot be named (``*args``) or do not build one."""
    cls = type(scheduler)
    args, kwargs = getattr(scheduler, "init_args", ((), {}))
    try:
        bound = inspect.signature(cls.__init__).bind(None, *args, **kwargs)
    except (TypeError, ValueError):
        return None
    named: dict[str, Any] = {}
    for p in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if p.name not in bound.arguments:
            continue
        if p.kind is p.VAR_POSITIONAL:
            return None
        if p.kind is p.VAR_KEYWORD:
            named.update(bound.arguments[p.name])
        else:
            named[p.name] = bound.arguments[p.name]
    named.pop("rng", None)  # a resume seeds it from the experiment's seed
    for attr in ("metric", "mode"):
        if getattr(scheduler, attr, None) is not None:
            named[attr] = getattr(scheduler, attr)
    try:
        cls(**named)
    except Exception:
        return None
    return named


class Decoder:
    """Decodes what :class:`Encoder` wrote; ``leaves()`` gives the pickled leaves (called
    only when one is met)."""

    def __init__(self, leaves: Callable[[], list[Any]]) -> None:
        self._leaves = leaves

    def decode(self, value: Any, where: str) -> Any:
        if _is_plain(value):
            return value
        if type(value) is list:
            return [self.decode(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if type(value) is not dict:
            raise ArgsDecodeError(f"{where}: {type(value).__name__} is no JSON value")
        if TAG not in value:
            return {k: self.decode(v, f"{where}[{k!r}]") for k, v in value.items()}
        kind = value[TAG]
        try:
            return self._tagged(kind, value, where)
        except (ArgsDecodeError, ImportFailed):
            raise
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise ArgsDecodeError(f"{where}: a {kind!r} value that does not decode ({e})") from e

    def _tagged(self, kind: Any, value: dict[str, Any], where: str) -> Any:
        if kind == "tuple":
            return tuple(self.decode(v, f"{where}[{i}]") for i, v in enumerate(value["items"]))
        if kind == "dict":
            return {k: self.decode(v, f"{where}[{k!r}]") for k, v in value["items"]}
        if kind == "domain":
            cls = getattr(domains, value["class"], None)
            if not (inspect.isclass(cls) and issubclass(cls, domains.Domain)):
                raise ArgsDecodeError(f"{where}: {value['class']!r} is no search space")
            return cls(**self.decode(value["fields"], where))
        if kind == "object":
            cls = import_path(value["class"])
            if not (
                cls is CheckpointConfig
                or (inspect.isclass(cls) and issubclass(cls, TrialScheduler))
            ):
                raise ArgsDecodeError(f"{where}: {value['class']!r} is no scheduler")
            return cls(**self.decode(value["kwargs"], where))
        if kind == "import":
            found = import_path(value["path"])
            if not (inspect.isfunction(found) or inspect.isclass(found)):
                raise ArgsDecodeError(f"{where}: {value['path']!r} is no function or class")
            return found
        if kind == "with_parameters":
            trainable = self.decode(value["trainable"], where)
            return with_stored_parameters(trainable, dict(value["paths"]))
        if kind == REF_KIND:
            return ObjectRef(value["name"])
        if kind == "pickled":
            index = value["index"]
            leaves = self._leaves()
            if type(index) is not int or not 0 <= index < len(leaves):
                raise ArgsDecodeError(f"{where}: no pickled value {index!r}")
            return leaves[index]
        raise ArgsDecodeError(f"{where}: unknown kind {kind!r}")
