"""Ray's ``tune.with_parameters``: large objects stored once, not pickled with every segment.

``with_parameters(train, data=big)`` returns a trainable that calls
``train(config, data=big)`` (a class trainable: ``setup(config, data=big)``).
When a run starts, each object is pickled once into the experiment's folder
(``.popflow/parameters/<sha256>.pkl``, written only if absent); every segment
then carries its path only, and each worker process loads it once and keeps
it. It outlives the driver too: ``popflow resume`` and ``Tuner.restore``
find the objects in storage, as Ray's object store cannot. A file is unpickled
only if its bytes match the SHA-256 in its name (:class:`ParametersMismatch`).
"""

from __future__ import annotations

import hashlib
import inspect
import posixpath
import threading
from typing import Any

import cloudpickle

from popflow.infra.storage.folder import Storage
from popflow.infra.store.layout import PARAMETERS_DIR, is_parameters_path, parameters_path


class ParametersMismatch(ValueError):
    """A ``with_parameters`` file is not what its name says (its SHA-256 differs, or the
    name is not one popflow gives): it is not unpickled."""


def check_stored_path(path: Any) -> str:
    """``path`` if it is a name :meth:`Parameters.store` gives; else ParametersMismatch."""
    if not is_parameters_path(path):
        raise ParametersMismatch(
            f"with_parameters: {path!r} is not a file popflow stores objects in "
            f"({PARAMETERS_DIR}/<SHA-256>.pkl); not loading it"
        )
    return path


def _verified(storage: Storage, path: str) -> bytes:
    """The bytes of the stored object ``path``, checked against the SHA-256 in its name."""
    data = storage.read_bytes(check_stored_path(path))
    if hashlib.sha256(data).hexdigest()[:32] != posixpath.basename(path)[:32]:
        raise ParametersMismatch(
            f"with_parameters file {storage.full_url(path)} does not match the SHA-256 its "
            "name records (changed since it was stored); not unpickling it"
        )
    return data


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
            path = parameters_path(hashlib.sha256(data).hexdigest())
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
                    _LOADED[key] = cloudpickle.loads(_verified(self._storage, path))
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
    return _wrap(trainable, Parameters(dict(objects)))


def with_stored_parameters(trainable: Any, paths: dict[str, str]) -> Any:
    """:func:`with_parameters` of ``trainable`` with objects already stored at ``paths``
    (a run's arguments read back: ``popflow resume``)."""
    return _wrap(trainable, Parameters(None, {k: check_stored_path(v) for k, v in paths.items()}))


def _wrap(trainable: Any, params: Parameters) -> Any:
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
    wrapped._popflow_trainable = trainable  # what it wraps (a run's arguments name it)
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


def wrapped_trainable(trainable: Any) -> Any:
    """The trainable a :func:`with_parameters` trainable wraps."""
    return trainable._popflow_trainable
