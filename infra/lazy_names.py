"""A package's public names imported on first use (PEP 562).

``import popflow`` then costs no numpy, fsspec, Dask or Prefect: the ``popflow``
command answers ``--help`` at once, and a Dask worker that imports the user's
trainable imports only the worker side.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any


def lazy_names(
    package: str, homes: dict[str, str], subpackages: Iterable[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: each name in ``homes`` comes from
    the module it maps to, each of ``subpackages`` is imported as ``package.<name>``.

    >>> getattr_, dir_ = lazy_names("json", {"dumps": "json"}, ["decoder"])
    >>> getattr_("dumps")({"a": 1}), "decoder" in dir_()
    ('{"a": 1}', True)
    """
    namespace = importlib.import_module(package).__dict__
    subpackages = tuple(subpackages)

    def __getattr__(name: str) -> Any:
        if name in subpackages:
            return importlib.import_module(f"{package}.{name}")  # the import sets the attribute
        module = homes.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later lookups skip this
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *homes, *subpackages})

    return __getattr__, __dir__
