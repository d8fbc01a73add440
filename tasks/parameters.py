"""Ray's ``tune.with_parameters``: large objects stored once, not pickled with every segment.

``with_parameters(train, data=big)`` returns a trainable that calls
``train(config, data=big)`` (a class trainable: ``setup(config, data=big)``).
When a run starts, each object is pickled once into the experiment's folder
(``.popflow/parameters/<sha256>.pkl``, written only if absent); every segment
then carries its path only, and each worker process loads it once and keeps
it. It outlives the driver too: ``popflow resume`` and ``Tuner.restore``
find the objects in storage, as Ray's object store cannot.
"""

from __future__ import annotations

import hashlib
import inspect
import threading
from typing import Any

import cloudpickle

from popflow.infra.storage import Storage

#: Where the objects live, inside the experiment's folder.
PARAMETERS_DIR = ".popflow/parameters"

#: Objects loaded in this process, by (experiment URL, path): one load per process.
_LOADED: dict[tuple[str, str], Any] = {}
_LOAD_LOCK = threading.Lock()


class Parameters:
    """The objects one :func:`with_parameters` call bound: in memory on the driver, as
    storage paths once pickled (after :meth:`store`)."""

    def __init__(self, objects: dict[str, Any] | None, paths: dict[str, str] | None = None):
        self._objects = objects
        self.paths = paths
        self._storage: Storage | None = None

    def store(self, storage: Storage) -> None:
        """Write each object into ``storage`` (the experiment's folder) unless it is there."""
        if self._objects is None:
            return  # unpickled from a run's arguments: already stored
        paths = {}
        for name, obj in self._objects.items():
            data = cloudpickle.dumps(obj)
            path = f"{PARAMETERS_DIR}/{hashlib.sha256(data).hexdigest()[:32]}.pkl"
            if not storage.file_exists(path):
                storage.write_bytes(data, path, durable=True)
            paths[name] = path
        self.paths = paths

    def attach(self, storage: Storage) -> None:
        """Where :meth:`load` reads from (on a worker: the segment's experiment folder)."""
        self._storage = storage

    def load(self) -> dict[str, Any]:
        if self._objects is not None:
            return self._objects
        if self.paths is None or self._storage is None:
            raise RuntimeError("with_parameters: the objects were never stored (popflow bug)")
        out = {}
        for name, path in self.paths.items():
            key = (self._storage.url, path)
            with _LOAD_LOCK:
                if key not in _LOADED:
                    _LOADED[key] = cloudpickle.loads(self._storage.read_bytes(path))
                out[name] = _LOADED[key]
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        if self.paths is None:
            raise RuntimeError(
                "a with_parameters trainable is pickled before its objects were stored; "
                "pass it to tune.Tuner / popflow.run, which store them"
            )
        return (Parameters, (None, self.paths))


def with_parameters(trainable: Any, **objects: Any) -> Any:
    """Ray's ``tune.with_parameters``: ``trainable`` called with ``objects`` as keyword
    arguments (a function: ``trainable(config, **objects)``; a Trainable class:
    ``setup(config, **objects)``), each object stored once per experiment."""
    if not objects:
        raise ValueError("with_parameters needs at least one keyword argument to pass on")
    params = Parameters(dict(objects))
    if inspect.isclass(trainable):

        class _WithParameters(trainable):  # type: ignore[misc, valid-type]
            _popflow_parameters = params

            def setup(self, config: dict[str, Any]) -> None:
                super().setup(config, **type(self)._popflow_parameters.load())

        wrapped: Any = _WithParameters
    elif callable(trainable):

        def wrapped(config: dict[str, Any]) -> Any:
            return trainable(config, **wrapped._popflow_parameters.load())

        wrapped._popflow_parameters = params
    else:
        raise TypeError(
            f"`trainable` must be a Trainable subclass or a function, got {trainable!r}"
        )
    # its name and module are the trainable's (trial folders, and shipping by value)
    wrapped.__name__ = trainable.__name__
    wrapped.__qualname__ = f"{getattr(trainable, '__qualname__', trainable.__name__)}"
    wrapped.__module__ = trainable.__module__
    wrapped.__doc__ = trainable.__doc__
    return wrapped


def parameters_of(trainable: Any) -> Parameters | None:
    """The :class:`Parameters` of a :func:`with_parameters` trainable (None: none)."""
    params = getattr(trainable, "_popflow_parameters", None)
    return params if isinstance(params, Parameters) else None
