"""Trainables named by import path (``"mypkg.train:MyTrainable"``): finding one, checking
that it is a trainable, and which paths a deployment may run.

An import path runs code twice: importing its module runs the module's top
level, and the run calls the object with a config. So the deployable
``experiment`` flow (whose parameters anyone who may start the deployment
chooses) first checks the path against the deployment owner's allowlist, before
any import, and then refuses anything that is not a trainable: a
:class:`~popflow.tasks.trainable.Trainable` subclass, or a Python function that
takes one positional ``config``. ``trainable="subprocess:call"`` with a
``param_space`` of ``{"touch": 1, "/tmp/x": 2}`` would otherwise run ``touch
/tmp/x`` on the worker. ``popflow resume`` finds a run's trainable by its path
too (:mod:`popflow.flows.spec.run_args`), with the same check.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Sequence
from typing import Any

from popflow.tasks.trainable import Trainable

#: The environment variable of the process that runs a deployed ``experiment`` flow
#: (the worker's, or its work pool's job template): comma-separated import prefixes
#: the flow may run, ``*`` for any. The deployment owner sets it; a flow run's
#: parameters cannot.
ALLOWLIST_ENV = "POPFLOW_TRAINABLE_ALLOWLIST"
#: Unset: popflow's own demo trainable only (the deployment in prefect.yaml runs it),
#: so a deployment runs nobody's code until its owner names the packages it may run.
DEFAULT_ALLOWLIST = ("popflow.tune.utils.mock_trainable",)


def allowlist() -> tuple[str, ...]:
    """The import prefixes a deployed flow may run here (:data:`ALLOWLIST_ENV`)."""
    value = os.environ.get(ALLOWLIST_ENV)
    if value is None or not value.strip():
        return DEFAULT_ALLOWLIST
    return tuple(p.strip() for p in value.split(",") if p.strip())


def is_allowed(path: str, prefixes: Sequence[str]) -> bool:
    """``path`` (``module:Name``) is under one of ``prefixes``: a package or module
    (``mypkg``, ``mypkg.train``: it and what lies below it), a module's names
    (``mypkg.train:``), one name (``mypkg.train:MyTrainable``), or ``*`` (any)."""
    module = path.partition(":")[0]
    for prefix in prefixes:
        if prefix == "*" or prefix == path:
            return True
        if prefix.endswith(":") and module == prefix[:-1]:
            return True
        if ":" not in prefix:
            package = prefix.rstrip(".")
            if module == package or module.startswith(package + "."):
                return True
    return False


def split_path(path: Any, argument: str = "trainable") -> tuple[str, str]:
    """``"pkg.module:Name"`` as (module, qualified name); ValueError if it is not one."""
    module, _, qualname = path.partition(":") if isinstance(path, str) else ("", "", "")
    if not module or not qualname:
        raise ValueError(f"`{argument}` is {path!r}, but must be 'package.module:Name'")
    return module, qualname


class ImportFailed(Exception):
    """An import path does not import here (``path``; ``error``: why, an ImportError or an
    AttributeError)."""

    def __init__(self, path: str, error: BaseException) -> None:
        super().__init__(f"{path}: {error}")
        self.path, self.error = path, error


def import_path(path: Any, argument: str = "trainable") -> Any:
    """The object at ``path`` (``module:qualname``); :class:`ImportFailed` if its module
    does not import or lacks it."""
    module_name, qualname = split_path(path, argument)
    try:
        obj: Any = importlib.import_module(module_name)
        for attr in qualname.split("."):
            obj = getattr(obj, attr)
    except (ImportError, AttributeError) as e:
        raise ImportFailed(path, e) from e
    return obj


def resolve(path: str, argument: str = "trainable") -> Any:
    """The object at ``path`` (a clear ValueError naming what is missing)."""
    try:
        return import_path(path, argument)
    except ImportFailed as failed:
        module_name, qualname = split_path(path, argument)
        if isinstance(failed.error, ImportError):
            raise ValueError(
                f"`{argument}` {path!r}: cannot import {module_name!r} ({failed.error}); "
                "install its package or run from the folder that holds it"
            ) from None
        raise ValueError(f"`{argument}` {path!r}: {module_name} has no {qualname!r}") from None


def path_of(obj: Any) -> str | None:
    """``obj``'s import path, if importing it by that path gives ``obj`` back (None for
    ``__main__``, a closure, a lambda, an object made at run time)."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        return None
    found: Any = sys.modules.get(module)
    for attr in qualname.split("."):
        found = getattr(found, attr, None)
    return f"{module}:{qualname}" if found is obj else None


def check_trainable(obj: Any, path: str) -> None:
    """ValueError unless ``obj`` (found at ``path``) is a trainable: a Trainable subclass,
    or a Python function taking one positional ``config`` (further parameters need
    defaults; no ``*args``)."""
    if inspect.isclass(obj):
        if issubclass(obj, Trainable):
            return
        raise ValueError(
            f"`trainable` {path!r} is the class {obj.__qualname__}, which does not subclass "
            "popflow.Trainable; refusing to run it"
        )
    if inspect.isfunction(obj):
        signature = inspect.signature(obj)
        try:
            signature.bind({})
        except TypeError:
            pass
        else:  # `*args` would take a config too, but no trainable is written so
            if not any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values()):
                return
        raise ValueError(
            f"`trainable` {path!r} is a function of {inspect.signature(obj)}, but a function "
            "trainable takes one positional argument, its config; refusing to run it"
        )
    raise ValueError(
        f"`trainable` {path!r} is {type(obj).__name__} {obj!r}, not a Trainable subclass nor a "
        "function of a config; refusing to run it"
    )


def load_trainable(path: Any, allowed: Sequence[str] | None = None) -> Any:
    """The trainable at ``path``. ``allowed``: the import prefixes it must match (checked
    before anything is imported; see :func:`is_allowed`), None for no allowlist."""
    split_path(path)
    if allowed is not None and not is_allowed(path, allowed):
        raise ValueError(
            f"`trainable` {path!r} is not among the trainables this deployment may run "
            f"({', '.join(allowed)}); its owner allows more with {ALLOWLIST_ENV} (comma-"
            "separated import prefixes) in the environment of the worker that runs it"
        )
    obj = resolve(path)
    check_trainable(obj, path)
    return obj
