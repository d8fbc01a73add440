"""Writes on object stores that depend on what is there: appends and creates.

Appends: object stores have none, so the object is read and rewritten whole.

The rewrite is one PUT, and that PUT is what is retried, never the
read-modify-write. On S3 the content and ETag of the last append to each log
are remembered, so the next append to it skips the read: one PUT conditional
on that ETag (``If-Match``). It falls back to read and rewrite when the object
changed meanwhile (``PreconditionFailed``), when a retried PUT had in fact
landed, and for good on a store without conditional PUTs (``NotImplemented``).
One writer per experiment (the lease holder) keeps the rewrites safe.

Creates (:meth:`ObjectWrites.create`): a PUT conditional on the name being
free (``If-None-Match: *``), so that of several writers exactly one succeeds;
a retried PUT that had landed is recognised by reading the object back. A
store without conditional PUTs gets an exists check, a write and a read back,
with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from popflow.infra.storage.errors import error_code

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Logs larger than this are not remembered between appends (memory of the driver).
TAIL_LIMIT = 8 << 20


class Attempt(Protocol):
    """``Storage._call``: run one idempotent filesystem call under the retry policy."""

    def __call__(self, op: str, path: str, fn: Callable[[], T]) -> T: ...


class _NoConditionalPut(Exception):
    """The store answered NotImplemented to a conditional PUT."""


class ObjectWrites:
    """Appends and creates on one object store, for one process.

    ``put(path, data, **kwargs)`` writes an object (returning the store's
    answer, with its ``ETag``), ``read(path)`` reads one, ``exists(path)``
    looks; ``conditional``: the store may take ``IfMatch``/``IfNoneMatch``
    (S3); ``url`` names the store in warnings.
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
        self._tails: dict[str, tuple[str, bytes]] | None = {} if conditional else None

    @property
    def remembered(self) -> int:
        """How many logs' contents are remembered for conditional appends."""
        return len(self._tails or {})

    def append(self, target: str, data: bytes) -> int:
        """Append ``data`` to the object ``target``; return its new size in bytes."""
        new = self._append_if_unchanged(target, data)
        if new is None:
            new = self._append_by_rewrite(target, data)
        return len(new)

    def forget(self, path: str) -> None:
        """Drop remembered contents at or under ``path`` (it is being changed)."""
        tails = self._tails  # the lease thread writes too: work on one reference
        if tails:
            for key in list(tails):
                if key == path or key.startswith(path + "/"):
                    tails.pop(key, None)

    def _append_if_unchanged(self, target: str, data: bytes) -> bytes | None:
        """One conditional PUT of the remembered content + ``data``; None if it did not apply."""
        if not self._tails or target not in self._tails:
            return None
        etag, old = self._tails.pop(target)
        new = old + data
        attempts = 0

        def put() -> Any:
            nonlocal attempts
            attempts += 1
            try:
                return self._put(target, new, IfMatch=etag)
            except OSError as e:
                code = error_code(e)
                if code == "PreconditionFailed" or (code == "NotImplemented" and attempts == 1):
                    return e
                raise

        try:
            out = self._attempt("append", target, put)
        except FileNotFoundError:
            return None
        if isinstance(out, OSError):
            if error_code(out) == "NotImplemented":
                self._tails = None  # this store has no conditional PUT: always rewrite
                return None
            if attempts > 1 and self._read_or_empty(target) == new:
                return new  # an earlier attempt did apply; its answer was lost
            return None
        self._remember(target, out, new)
        return new

    def _append_by_rewrite(self, target: str, data: bytes) -> bytes:
        new = self._read_or_empty(target) + data
        out = self._attempt("append", target, lambda: self._put(target, new))
        self._remember(target, out, new)
        return new

    def _read_or_empty(self, target: str) -> bytes:
        try:
            return self._attempt("append", target, lambda: self._read(target))
        except FileNotFoundError:
            return b""

    def _remember(self, target: str, put_response: Any, content: bytes) -> None:
        etag = put_response.get("ETag") if isinstance(put_response, Mapping) else None
        if self._tails is not None and etag and len(content) <= TAIL_LIMIT:
            self._tails[target] = (etag, content)

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
