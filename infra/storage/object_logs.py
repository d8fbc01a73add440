"""The derived logs on an object store, fenced by conditional PUTs
(:mod:`popflow.infra.storage.log_writes` says why).

Every write is one PUT conditional on the ETag this writer last saw (``If-Match``); a
new log is a PUT conditional on the name being free (``If-None-Match: *``). There is no
read-then-rewrite: a log changed by someone else is never written over, it raises
:class:`~popflow.infra.storage.errors.LogConflict`. A retried PUT that had landed is
recognised by reading the object back. A store without conditional PUTs is fenced by
the log's size only, with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fsspec.asyn import sync

from popflow.infra.storage.errors import LogConflict, error_code

logger = logging.getLogger(__name__)

#: A log larger than this is not kept in memory between appends: its next append reads
#: it back (conditionally) instead.
CONTENT_LIMIT = 8 << 20

NOT_ADOPTED = (
    "it exists but this driver did not write it (a resume adopts the logs it goes on with first)"
)
CHANGED = "another driver wrote it since this one did (its ETag changed)"

_REFUSED = ("PreconditionFailed", "ConditionalRequestConflict")
_Missing = object()  # a conditional PUT's answers besides the store's own
_NoConditional = object()


@dataclass
class Known:
    """A log as this writer left it."""

    etag: str
    size: int
    content: bytes | None  # None: over CONTENT_LIMIT, read back before the next write


class ObjectLogs:
    """What one writer knows of its logs on one object store, and the writes that depend
    on it. ``call``: :meth:`Storage._call <popflow.infra.storage.calls.StorageCalls._call>`;
    ``fs``: the store's fsspec filesystem (s3fs); ``conditional``: it takes
    ``If-Match``/``If-None-Match``; ``url``: the store, for warnings."""

    def __init__(self, call: Callable[..., Any], fs: Any, conditional: bool, url: str) -> None:
        self._call = call
        self._fs = fs
        self._conditional = conditional
        self._url = url
        self._warned = False
        self.known: dict[str, Known] = {}

    def append(self, path: str, data: bytes) -> int:
        known = self.known.get(path)
        if known is None:
            if self._create(path, data):
                return len(data)
            raise LogConflict(NOT_ADOPTED)
        old = known.content if known.content is not None else self._read_known(path, known)
        self._put_if(path, old + data, known.etag, "append")
        return len(old) + len(data)

    def cut(self, path: str, length: int) -> None:
        known = self.known.get(path)
        if known is None:
            if self._head(path) is not None:
                raise LogConflict("it exists but this driver did not write it")
            return
        if length >= known.size:
            return
        old = known.content if known.content is not None else self._read_known(path, known)
        self._put_if(path, old[:length], known.etag, "truncate")

    def adopt(self, path: str, keep: int, data: bytes, etag: str) -> None:
        """Take over the log read as ``data`` at ``etag``, cut back to ``keep`` bytes."""
        if len(data) > keep:
            self.known[path] = Known(etag, len(data), None)  # the expectation of the cut
            self._put_if(path, data[:keep], etag, "adopt")
        else:
            self._remember(path, etag, data)

    def get(self, path: str) -> tuple[bytes, str] | None:
        """The object's content and ETag, read together (None: not there)."""
        fs = self._fs
        bucket, key, _ = fs.split_path(path)

        async def get() -> tuple[bytes, str]:
            resp = await fs._call_s3("get_object", Bucket=bucket, Key=key)
            body = resp["Body"]
            try:
                data = await body.read()
            finally:
                body.close()
            return data, str(resp.get("ETag", ""))

        try:
            return self._call("read", path, lambda: sync(fs.loop, get))
        except FileNotFoundError:
            return None

    # -- conditional PUTs ----------------------------------------------------------------
    def _put(self, op: str, path: str, content: bytes, **condition: str) -> tuple[Any, int]:
        """One PUT of ``content`` under ``condition``, retried as :meth:`Storage._call`
        retries; its answer (or ``None``: refused by the condition; ``_Missing``: an
        ``If-Match`` on no object; ``_NoConditional``: the store takes no conditions) and
        how many attempts it took."""
        attempts = 0

        def put() -> Any:
            nonlocal attempts
            attempts += 1
            try:
                return self._fs.pipe_file(path, content, **condition)
            except FileNotFoundError:
                if "IfMatch" not in condition:
                    raise  # a create: the bucket is missing (Storage._call says so)
                return _Missing
            except OSError as e:
                code = error_code(e)
                if code in _REFUSED:
                    return None
                if code == "NotImplemented" and attempts == 1:
                    return _NoConditional
                raise

        return self._call(op, path, put), attempts

    def _landed_before(self, path: str, content: bytes, attempts: int) -> bool:
        """A refused retry whose earlier attempt had landed (its answer lost)."""
        got = self.get(path) if attempts > 1 else None
        if got is not None and got[0] == content:
            self._remember(path, got[1], content)
            return True
        return False

    def _create(self, path: str, data: bytes) -> bool:
        if not self._conditional:
            return self._create_unconditionally(path, data)
        out, attempts = self._put("append", path, data, IfNoneMatch="*")
        if out is _NoConditional:
            self._conditional = False
            return self._create_unconditionally(path, data)
        if out is None:
            return self._landed_before(path, data, attempts)
        self._remember(path, _etag(out), data)
        return True

    def _put_if(self, path: str, content: bytes, etag: str, op: str) -> None:
        """One PUT of ``content``, landing only if the object's ETag is still ``etag``."""
        if not self._conditional:
            self._put_checked_by_size(path, content, op)
            return
        out, attempts = self._put(op, path, content, IfMatch=etag)
        if out is _NoConditional:  # a store without If-Match: fenced by size from now on
            self._conditional = False
            self._put_checked_by_size(path, content, op)
        elif out is _Missing:
            raise LogConflict("it was removed")
        elif out is None:
            if not self._landed_before(path, content, attempts):
                raise LogConflict(CHANGED)
        else:
            self._remember(path, _etag(out), content)

    def _read_known(self, path: str, known: Known) -> bytes:
        """The content of a log too large to keep in memory, if it is still the one
        this writer left."""
        got = self.get(path)
        if got is None:
            raise LogConflict("it was removed")
        data, etag = got
        if etag != known.etag or len(data) != known.size:
            raise LogConflict(CHANGED)
        return data

    def _head(self, path: str) -> Mapping[str, Any] | None:
        fs = self._fs
        bucket, key, _ = fs.split_path(path)
        try:
            return self._call(
                "exists", path, lambda: fs.call_s3("head_object", Bucket=bucket, Key=key)
            )
        except FileNotFoundError:
            return None

    def _remember(self, path: str, etag: str, content: bytes) -> None:
        keep = content if len(content) <= CONTENT_LIMIT else None
        self.known[path] = Known(etag, len(content), keep)

    # -- stores without conditional PUTs ---------------------------------------------
    def _warn_unfenced(self) -> None:
        if not self._warned:
            logger.warning(
                "%s has no conditional PUT (If-Match): a driver stalled past its lease could "
                "still write one log line after a newer driver's",
                self._url,
            )
            self._warned = True

    def _create_unconditionally(self, path: str, data: bytes) -> bool:
        self._warn_unfenced()
        if self._call("exists", path, lambda: self._fs.exists(path)):
            return False
        out = self._call("append", path, lambda: self._fs.pipe_file(path, data))
        self._remember(path, _etag(out), data)
        return True

    def _put_checked_by_size(self, path: str, content: bytes, op: str) -> None:
        self._warn_unfenced()
        known = self.known.get(path)
        size = self._call("size", path, lambda: self._fs.size(path))
        if known is not None and size != known.size:
            raise LogConflict(f"it is {size} bytes, not the {known.size} this driver left")
        out = self._call(op, path, lambda: self._fs.pipe_file(path, content))
        self._remember(path, _etag(out), content)


def _etag(put_response: Any) -> str:
    return str(put_response.get("ETag", "")) if isinstance(put_response, Mapping) else ""
