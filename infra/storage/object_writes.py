"""Creates on object stores: write an object only if its name is free.

:meth:`ObjectWrites.create` is a PUT conditional on the name being free
(``If-None-Match: *``), so that of several writers exactly one succeeds; a
retried PUT that had landed is recognised by reading the object back. A store
without conditional PUTs gets an exists check, a write and a read back, with a
warning. (Appends to the derived logs: :mod:`popflow.infra.storage.log_writes`.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from popflow.infra.storage.errors import error_code

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Attempt(Protocol):
    """``Storage._call``: run one idempotent filesystem call under the retry policy."""

    def __call__(self, op: str, path: str, fn: Callable[[], T]) -> T: ...


class _NoConditionalPut(Exception):
    """The store answered NotImplemented to a conditional PUT."""


class ObjectWrites:
    """Creates on one object store, for one process.

    ``put(path, data, **kwargs)`` writes an object (returning the store's
    answer), ``read(path)`` reads one, ``exists(path)`` looks; ``conditional``:
    the store may take ``IfNoneMatch`` (S3); ``url`` names the store in warnings.
    """

    def __init__(
        self,
        attempt: Attempt,
        put: Callable[..., Any],
        read: Callable[[str], bytes],
        exists: Callable[[str], bool],
        conditional: bool,
        url: str,
    ) -> None:
        self._attempt = attempt
        self._put = put
        self._read = read
        self._exists = exists
        self._url = url
        self._conditional_create = conditional
        self._warned = False

    # -- creates -----------------------------------------------------------------
    def create(self, target: str, data: bytes) -> bool:
        """Write ``data`` at ``target`` only if nothing is there; False if something is."""
        if not self._conditional_create:
            return self._create_unconditionally(target, data)
        attempts = 0

        def put() -> bool:
            nonlocal attempts
            attempts += 1
            try:
                self._put(target, data, IfNoneMatch="*")
            except OSError as e:
                code = error_code(e)
                if code in ("PreconditionFailed", "ConditionalRequestConflict"):
                    return False
                if code == "NotImplemented":
                    raise _NoConditionalPut() from None
                raise
            return True

        try:
            created = self._attempt("create", target, put)
        except _NoConditionalPut:
            self._conditional_create = False
            return self._create_unconditionally(target, data)
        if not created and attempts > 1:
            return self._read_or_none(target) == data  # an earlier attempt had landed
        return created

    def _create_unconditionally(self, target: str, data: bytes) -> bool:
        if not self._warned:
            logger.warning(
                "%s has no conditional PUT (If-None-Match): creating objects is "
                "write-then-read-back there, and two drivers starting at the same "
                "instant could both go on",
                self._url,
            )
            self._warned = True
        if self._attempt("exists", target, lambda: self._exists(target)):
            return False
        self._attempt("write", target, lambda: self._put(target, data))
        return self._read_or_none(target) == data

    def _read_or_none(self, target: str) -> bytes | None:
        try:
            return self._attempt("read", target, lambda: self._read(target))
        except FileNotFoundError:
            return None
