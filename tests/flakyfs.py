"""A local filesystem that fails a fraction of calls with transient errors.

Fault injection for whole runs (driver and Dask workers): ``flaky://<path>``
with ``storage_options={"failure_rate": 0.15, "fault_log": <file>}``. A call
fails (before doing anything) with ``TimeoutError`` at that rate, never more
than twice in a row for one operation and path, so the storage layer's
retries always get through; each injected failure appends a line to
``fault_log``. Registered with fsspec when this module is imported (the
tests' trainables import it, so every worker process has it).
"""

from __future__ import annotations

import os
import random
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

#: the calls popflow's Storage makes through a local filesystem
FLAKY_METHODS = (
    "exists",
    "cat_file",
    "size",
    "ls",
    "find",
    "get_file",
    "put_file",
    "cp_file",
    "rm",
    "rm_file",
)


class FlakyLocalFileSystem(LocalFileSystem):
    protocol = "flaky"

    def __init__(self, failure_rate: float = 0.1, fault_log: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.failure_rate = failure_rate
        self.fault_log = fault_log
        self._rng = random.Random()  # private: the global random belongs to the trainables
        self._streak: dict[tuple[str, str], int] = {}

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, str) and path.startswith("flaky://"):
            path = path[len("flaky://") :]
        return super()._strip_protocol(path)

    def _maybe_fail(self, method: str, path: Any) -> None:
        key = (method, str(path))
        if self._streak.get(key, 0) < 2 and self._rng.random() < self.failure_rate:
            self._streak[key] = self._streak.get(key, 0) + 1
            if self.fault_log:
                with open(self.fault_log, "a") as f:
                    f.write(f"{os.getpid()} {method} {path}\n")
            raise TimeoutError(f"injected: {method} {path} timed out")
        self._streak.pop(key, None)


def _flaky(name: str) -> Any:
    original = getattr(LocalFileSystem, name)

    def call(self: FlakyLocalFileSystem, path: Any, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail(name, path)
        return original(self, path, *args, **kwargs)

    call.__name__ = name
    return call


for _name in FLAKY_METHODS:
    setattr(FlakyLocalFileSystem, _name, _flaky(_name))

fsspec.register_implementation("flaky", FlakyLocalFileSystem, clobber=True)
