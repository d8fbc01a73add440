"""Storage through fsspec URLs: a plain path means a local folder, ``s3://`` means S3.

A :class:`Storage` is picklable (URL + options; the filesystem is created
lazily per process), so the driver hands the same object to Dask workers.
Every write that others may read is published atomically:

- local: write to a temporary sibling, then ``os.replace`` (atomic rename);
- object stores: a single PUT is atomic per object, and multi-object
  artefacts (checkpoints) become visible through a manifest written last
  (see :mod:`popflow.infra.checkpoint_store`).

Every filesystem call goes through one helper, :meth:`Storage._call`:

- transient errors (timeouts, dropped connections, HTTP 5xx, throttling such
  as S3's ``SlowDown``) are retried with exponential backoff and jitter
  (:class:`RetryPolicy`), each retry logged at WARNING;
- a permanent error, or a transient one that outlasts the policy, raises
  :class:`StorageError` (an ``OSError``) naming the operation and the URL;
- ``FileNotFoundError`` passes through unchanged, and so do programming
  errors (``TypeError``, ``ValueError``);
- on object stores the filesystem's listing cache is dropped for the path
  before and after each call, so a listing sees every write before it, also
  writes made by other processes (Dask workers).

Each call that is retried is idempotent (a whole PUT, a GET, a listing, a
delete that tolerates "already gone"), so a retry after an ambiguous failure
(the request reached the server, the answer did not come back) neither
duplicates nor loses data. Appends on object stores are a read, then one PUT
of the whole new content: the PUT is what is retried, never the read-modify-write.
On S3 the next append to the same object skips the read: one PUT conditional
on the ETag of the last one (``If-Match``), falling back to read and rewrite
when the object changed meanwhile, or when a retried PUT had in fact landed.

Credentials in ``storage_options`` never appear in reprs, log records or
error messages (they are masked wherever a message quotes an underlying error),
and generic serialisers that walk ``vars()`` (FastAPI's ``jsonable_encoder``,
which Prefect uses for flow parameters) cannot reach them: a Storage passed
as a Prefect flow parameter is recorded as ``"<Storage>"``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import posixpath
import random
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem

logger = logging.getLogger(__name__)

T = TypeVar("T")


# -- errors and their classification ---------------------------------------------


class StorageError(OSError):
    """A storage operation failed for good: a permanent error, or retries ran out.

    ``errno`` is the underlying ``OSError``'s (e.g. ``ENOSPC``), if it had one.
    """

    def __init__(self, operation: str, url: str, reason: str, code: int | None = None) -> None:
        super().__init__(f"storage {operation} of {url} failed: {reason}")
        self.operation = operation
        self.url = url
        self.reason = reason
        self.errno = code

    def __reduce__(self) -> tuple[Any, ...]:  # Dask ships worker errors back by pickling
        return (type(self), (self.operation, self.url, self.reason, self.errno))


#: errnos of failures worth another attempt (EREMOTEIO is what s3fs makes of a 500).
_TRANSIENT_ERRNOS = frozenset(
    getattr(errno, name)
    for name in (
        "EAGAIN",
        "EBUSY",
        "EINTR",
        "EIO",
        "ETIMEDOUT",
        "ECONNRESET",
        "ECONNREFUSED",
        "ECONNABORTED",
        "EPIPE",
        "ENETDOWN",
        "ENETUNREACH",
        "ENETRESET",
        "EHOSTDOWN",
        "EHOSTUNREACH",
        "EREMOTEIO",
    )
    if hasattr(errno, name)
)

#: Error codes that object stores answer when asked to slow down, or when they hiccup.
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "ProvisionedThroughputExceededException",
        "BandwidthLimitExceeded",
        "RequestTimeout",
        "RequestTimeoutException",
        "InternalError",
        "ServiceUnavailable",
        "503",
        "500",
    }
)

#: Transport errors of botocore and aiohttp, by class name (no import of either needed).
_TRANSIENT_CLASSES = frozenset(
    {
        "HTTPClientError",  # botocore: ReadTimeoutError, ConnectionClosedError, ...
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ConnectionClosedError",
        "ResponseStreamingError",
        "IncompleteReadError",
        "ResponseParserError",
        "IncompleteRead",  # http.client
        "ClientConnectionError",  # aiohttp
        "ClientPayloadError",
        "ServerDisconnectedError",
        "ServerTimeoutError",
    }
)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from, as a traceback shows them (no cycles)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 8:
        seen.add(id(current))
        yield current
        if current.__cause__ is not None:
            current = current.__cause__
        else:
            current = None if current.__suppress_context__ else current.__context__


def _http_answer(exc: BaseException) -> Mapping[str, Any] | None:
    """The HTTP error answer carried by ``exc`` (botocore's ``ClientError`` shape), if any."""
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping) and isinstance(response.get("Error"), Mapping):
        return response
    return None


def _http_verdict(exc: BaseException) -> bool | None:
    """For an HTTP error answer: transient or not (None: ``exc`` is no HTTP answer)."""
    response = _http_answer(exc)
    if response is None:
        return None
    code = str(response["Error"].get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    if code in _TRANSIENT_CODES:
        return True
    if isinstance(status, int):
        return status >= 500 or status == 429
    return False


def is_transient(exc: BaseException, remote: bool = True) -> bool:
    """True if ``exc`` is a failure that may go away when the call is repeated.

    An HTTP answer (found anywhere in the exception's chain) decides by its
    status and code: 5xx, 429 and throttling codes are transient, other 4xx
    are not. Otherwise timeouts, connection errors and ``OSError`` with a
    transient errno are. ``remote``: an ``OSError`` without an errno counts
    (a plain ``OSError``, not a subclass such as ``PermissionError``) counts as
    transient on a remote filesystem (transport failures often have none), as
    permanent on local disk. ``FileNotFoundError`` never is.

    >>> import errno
    >>> is_transient(TimeoutError()), is_transient(OSError(errno.ENOSPC, "full"))
    (True, False)
    """
    if isinstance(exc, FileNotFoundError):
        return False
    for link in _chain(exc):
        verdict = _http_verdict(link)
        if verdict is not None:
            return verdict
    for link in _chain(exc):
        if isinstance(link, TimeoutError | ConnectionError):
            return True
        if any(cls.__name__ in _TRANSIENT_CLASSES for cls in type(link).__mro__):
            return True
    if isinstance(exc, OSError):
        if exc.errno is not None:
            return exc.errno in _TRANSIENT_ERRNOS
        return remote and type(exc) is OSError  # not PermissionError, IsADirectoryError, ...
    return False


def _error_code(exc: BaseException) -> str | None:
    """The error code of the HTTP answer behind ``exc`` (e.g. "PreconditionFailed"), if any."""
    for link in _chain(exc):
        response = _http_answer(link)
        if response is not None:
            return str(response["Error"].get("Code", ""))
    return None


def _is_storage_failure(exc: BaseException) -> bool:
    """An error of the filesystem or its transport (vs a bug such as a TypeError)."""
    if isinstance(exc, OSError) or _http_verdict(exc) is not None:
        return True
    return type(exc).__module__.split(".")[0] in ("botocore", "aiobotocore", "aiohttp", "s3fs")


# -- retries -----------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """How transient storage errors are retried: exponential backoff with jitter.

    Retry ``n`` (1-based) waits ``min(max_delay, base_delay * 2**(n-1))``
    scaled by a random factor in [0.5, 1]. At most ``attempts`` calls are
    made, and no retry starts that would begin later than ``deadline``
    seconds after the first call.
    """

    attempts: int = 5
    base_delay: float = 0.25
    max_delay: float = 4.0
    deadline: float = 30.0

    def __post_init__(self) -> None:
        if not (isinstance(self.attempts, int) and self.attempts >= 1):
            raise ValueError(f"`attempts` is {self.attempts!r}, but must be an integer >= 1")
        for name in ("base_delay", "max_delay", "deadline"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"`{name}` is {value!r}, but must be >= 0")
        if self.max_delay < self.base_delay:
            raise ValueError(
                f"`max_delay` is {self.max_delay!r}, but must be >= `base_delay` "
                f"({self.base_delay!r})"
            )


def backoff_delay(retry: int, policy: RetryPolicy, rng: random.Random) -> float:
    """Seconds to wait before retry number ``retry`` (1-based) under ``policy``."""
    ceiling = min(policy.max_delay, policy.base_delay * 2.0 ** (retry - 1))
    return ceiling * (0.5 + 0.5 * rng.random())


# -- credentials -------------------------------------------------------------------

_SECRET_HINTS = ("key", "secret", "token", "password", "passwd", "credential")


def secret_values(options: Mapping[str, Any]) -> list[str]:
    """String values in ``options`` (nested too) whose key names a credential, longest first."""
    found: list[str] = []
    for k, v in options.items():
        if isinstance(v, Mapping):
            found += secret_values(v)
        elif isinstance(v, str) and len(v) >= 4 and any(h in str(k).lower() for h in _SECRET_HINTS):
            found.append(v)
    return sorted(set(found), key=len, reverse=True)


def redact(text: str, secrets: list[str]) -> str:
    for s in secrets:
        text = text.replace(s, "***")
    return text


# -- storage -----------------------------------------------------------------------

#: Logs larger than this are not remembered between appends (memory of the driver).
_TAIL_LIMIT = 8 << 20


class _Hidden:
    """Holds a value out of reach of ``vars()``-walking serialisers; pickles normally."""

    __slots__ = ("value",)

    def __init__(self, value: dict[str, Any]) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<hidden>"


class Storage:
    """A root folder on an fsspec filesystem; paths passed to methods are relative to it.

    >>> import tempfile
    >>> s = Storage(tempfile.mkdtemp())
    >>> s.write_text("hello", "a", "b.txt")
    >>> s.listdir("a"), s.read_text("a", "b.txt")
    (['b.txt'], 'hello')
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        storage_options: dict[str, Any] | None = None,
        retry: RetryPolicy | None = None,
    ):
        url = os.fspath(url)
        if not url:
            raise ValueError(
                "`storage` is empty; give a local folder or a URL such as s3://bucket/prefix"
            )
        self._options = _Hidden(dict(storage_options or {}))
        self.retry = retry or RetryPolicy()
        fs, root = fsspec.core.url_to_fs(url, **self.storage_options)
        self.protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self.is_local = isinstance(fs, LocalFileSystem)
        # s3fs asks for an object's size (a HEAD) before each GET, to split big
        # downloads; whole small objects (logs, commits, manifests) need one GET
        s3 = self.protocol in ("s3", "s3a")
        self._read_kwargs = {"max_concurrency": 1} if s3 else {}
        # appends on S3: the content and ETag this object last wrote per log, so that
        # the next append is one PUT with If-Match instead of a GET and a PUT
        self._tails: dict[str, tuple[str, bytes]] | None = {} if s3 else None
        self.root = os.path.abspath(root) if self.is_local else root.rstrip("/")
        self._fs: fsspec.AbstractFileSystem | None = fs
        self._rng: random.Random | None = None

    # -- identity and pickling -------------------------------------------------
    @property
    def storage_options(self) -> dict[str, Any]:
        """The fsspec options (credentials included: never log or persist them)."""
        return self._options.value

    @property
    def url(self) -> str:
        return self.root if self.is_local else f"{self.protocol}://{self.root}"

    def __repr__(self) -> str:  # never show storage_options: they may hold credentials
        return f"Storage({self.url!r})"

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fs"] = None
        state["_rng"] = None  # each process jitters on its own
        state["_tails"] = None if self._tails is None else {}
        return state

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        if self._fs is None:
            self._fs = fsspec.filesystem(self.protocol, **self.storage_options)
        return self._fs

    def child(self, *parts: str) -> Storage:
        """A Storage rooted at a sub-folder."""
        sub = Storage.__new__(Storage)
        sub.__dict__.update(self.__getstate__())
        sub.root = self.path(*parts)
        sub._fs = self._fs
        return sub

    def path(self, *parts: str) -> str:
        """Absolute filesystem path of ``parts`` under the root."""
        for part in parts:
            if part.startswith("/"):  # posixpath.join would drop the root and escape it
                raise ValueError(
                    f"storage path part {part!r} is absolute; give paths relative to {self.url}"
                )
        return posixpath.join(self.root, *parts) if parts else self.root

    def full_url(self, *parts: str) -> str:
        return self._url_of(self.path(*parts))

    def _url_of(self, path: str) -> str:
        return path if self.is_local else f"{self.protocol}://{path}"

    # -- the one place where filesystem calls are made --------------------------
    def _call(self, op: str, path: str, fn: Callable[[], T], *, retry: bool = True) -> T:
        """Run ``fn`` (one idempotent filesystem call on ``path``) under the retry policy.

        ``retry=False`` for a call that must not be repeated (a local append):
        its errors are still reported as :class:`StorageError`.
        """
        policy = self.retry
        start = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            self._forget(path)
            try:
                out = fn()
            except FileNotFoundError:
                raise
            except Exception as e:
                if not _is_storage_failure(e):
                    raise  # a bug (TypeError, ValueError, ...), not a storage failure
                failure = e
            else:
                self._forget(path)
                return out
            # outside the except block: a failure quoting credentials is not chained
            delay = backoff_delay(attempt, policy, self._jitter())
            if not (retry and is_transient(failure, remote=not self.is_local)):
                raise self._error(op, path, failure, "")
            if attempt >= policy.attempts or time.monotonic() - start + delay > policy.deadline:
                raise self._error(op, path, failure, f" (gave up after {attempt} attempts)")
            logger.warning(
                "storage %s of %s failed (attempt %d of %d): %s; retrying in %.2f s",
                op,
                self._url_of(path),
                attempt,
                policy.attempts,
                self._describe(failure),
                delay,
            )
            time.sleep(delay)

    def _describe(self, exc: BaseException) -> str:
        return redact(f"{type(exc).__name__}: {exc}", self._secrets())

    def _error(self, op: str, path: str, exc: BaseException, note: str) -> StorageError:
        """The StorageError for ``exc``; chained to it unless its chain quotes a credential."""
        code = exc.errno if isinstance(exc, OSError) else None
        error = StorageError(op, self._url_of(path), self._describe(exc) + note, code)
        secrets = self._secrets()
        if not any(s in str(link) for link in _chain(exc) for s in secrets):
            error.__cause__ = exc
        return error

    def _forget(self, path: str) -> None:
        """Drop cached listings of ``path`` and its parents (object stores cache them)."""
        if not self.is_local:
            self.fs.invalidate_cache(path)

    def _secrets(self) -> list[str]:
        return secret_values(self.storage_options)

    def _jitter(self) -> random.Random:
        if self._rng is None:
            self._rng = random.Random()  # private: never the global `random`
        return self._rng

    # -- reads -------------------------------------------------------------------
    def exists(self, *parts: str) -> bool:
        p = self.path(*parts)
        return self._call("exists", p, lambda: self.fs.exists(p))

    def read_bytes(self, *parts: str) -> bytes:
        p = self.path(*parts)
        return self._call("read", p, lambda: self._read_object(p))

    def read_text(self, *parts: str) -> str:
        return self.read_bytes(*parts).decode("utf-8")

    def _read_object(self, path: str) -> bytes:
        return self.fs.cat_file(path, **self._read_kwargs)

    def size(self, *parts: str) -> int:
        p = self.path(*parts)
        return int(self._call("size", p, lambda: self.fs.size(p)))

    def listdir(self, *parts: str) -> list[str]:
        """Names (not paths) directly under ``parts``; empty if it does not exist."""
        p = self.path(*parts)
        try:
            entries = self._call("listdir", p, lambda: self.fs.ls(p, detail=False))
        except FileNotFoundError:
            return []
        return sorted(posixpath.basename(e.rstrip("/")) for e in entries)

    def _find(self, path: str) -> list[str]:
        try:
            return sorted(self._call("find", path, lambda: self.fs.find(path)))
        except FileNotFoundError:
            return []

    def walk_files(self, *parts: str) -> Iterator[str]:
        """Paths of all files under ``parts``, relative to it."""
        base = self.path(*parts)
        for f in self._find(base):
            yield posixpath.relpath(f, base)

    def get_file(self, local_path: str, *parts: str) -> None:
        """Download one file to ``local_path`` (its folder must exist)."""
        p = self.path(*parts)
        self._call("download", p, lambda: self.fs.get_file(p, local_path))

    def get_dir(self, local_dir: str, *parts: str) -> None:
        """Copy the files under ``parts`` into a local folder."""
        for rel in self.walk_files(*parts):
            dst = os.path.join(local_dir, *rel.split("/"))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            self.get_file(dst, *parts, rel)

    # -- writes ------------------------------------------------------------------
    def makedirs(self, *parts: str) -> None:
        if self.is_local:
            p = self.path(*parts)
            self._call("makedirs", p, lambda: os.makedirs(p, exist_ok=True))

    def write_bytes(self, data: bytes, *parts: str, durable: bool = False) -> None:
        """Publish ``data`` atomically: readers see the old object or the new one.

        ``durable``: on local disk, also fsync before the rename, so the object
        survives a machine crash, not only a process crash (commits use it;
        checkpoints rely on their checksums instead, which are checked on load).
        An object store's PUT is durable once answered.
        """
        target = self.path(*parts)
        self._forget_tails(target)
        if self.is_local:
            self._call("write", target, lambda: _replace_file(target, data, durable))
        else:
            self._call("write", target, lambda: self.fs.pipe_file(target, data))

    def write_text(self, text: str, *parts: str, durable: bool = False) -> None:
        self.write_bytes(text.encode("utf-8"), *parts, durable=durable)

    def append_text(self, text: str, *parts: str) -> int:
        """Append ``text`` and return the new size in bytes.

        Local files are appended in place (not retried: a repeated append could
        duplicate). Object stores have no append, so the object is read and
        rewritten whole by one PUT (fine for the small logs we append to; one
        writer per experiment, the lease holder). On S3 the object's content
        and ETag are remembered after each append: the next one is a single
        PUT conditional on that ETag (``If-Match``), and falls back to read
        and rewrite if anyone else changed the object meanwhile.
        """
        data = text.encode("utf-8")
        target = self.path(*parts)
        if self.is_local:
            return self._call("append", target, lambda: _append_file(target, data), retry=False)
        new = self._append_if_unchanged(target, data)
        if new is None:
            new = self._append_by_rewrite(target, data)
        return len(new)

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
                return self.fs.pipe_file(target, new, IfMatch=etag)
            except OSError as e:
                code = _error_code(e)
                if code == "PreconditionFailed" or (code == "NotImplemented" and attempts == 1):
                    return e
                raise

        try:
            out = self._call("append", target, put)
        except FileNotFoundError:
            return None
        if isinstance(out, OSError):
            if _error_code(out) == "NotImplemented":
                self._tails = None  # this store has no conditional PUT: always rewrite
                return None
            if attempts > 1 and self._read_or_empty(target) == new:
                return new  # an earlier attempt did apply; its answer was lost
            return None
        self._remember(target, out, new)
        return new

    def _append_by_rewrite(self, target: str, data: bytes) -> bytes:
        new = self._read_or_empty(target) + data
        out = self._call("append", target, lambda: self.fs.pipe_file(target, new))
        self._remember(target, out, new)
        return new

    def _read_or_empty(self, target: str) -> bytes:
        try:
            return self._call("append", target, lambda: self._read_object(target))
        except FileNotFoundError:
            return b""

    def _remember(self, target: str, put_response: Any, content: bytes) -> None:
        etag = put_response.get("ETag") if isinstance(put_response, Mapping) else None
        if self._tails is not None and etag and len(content) <= _TAIL_LIMIT:
            self._tails[target] = (etag, content)

    def _forget_tails(self, path: str) -> None:
        """Drop remembered log contents at or under ``path`` (it is being changed)."""
        tails = self._tails  # the lease thread writes too: work on one reference
        if tails:
            for key in list(tails):
                if key == path or key.startswith(path + "/"):
                    tails.pop(key, None)

    def truncate(self, length: int, *parts: str) -> None:
        """Cut a file back to ``length`` bytes (used to drop uncommitted appends); never extends."""
        target = self.path(*parts)
        self._forget_tails(target)
        if self.is_local:
            with contextlib.suppress(FileNotFoundError):
                self._call("truncate", target, lambda: _truncate_file(target, length))
            return
        try:
            data = self._call("truncate", target, lambda: self._read_object(target))
        except FileNotFoundError:
            return
        if len(data) > length:
            self._call("truncate", target, lambda: self.fs.pipe_file(target, data[:length]))

    def put_file(self, local_path: str, *parts: str) -> None:
        """Upload one local file (one PUT on object stores; not atomic on local disk)."""
        dst = self.path(*parts)
        self._forget_tails(dst)

        def put() -> None:
            if self.is_local:
                os.makedirs(os.path.dirname(dst), exist_ok=True)
            self.fs.put_file(local_path, dst)

        self._call("upload", dst, put)

    def put_dir(self, local_dir: str, *parts: str) -> None:
        """Copy a local folder's files under ``parts`` (not atomic on its own)."""
        for dirpath, _dirs, files in os.walk(local_dir):
            for name in sorted(files):
                src = os.path.join(dirpath, name)
                rel = os.path.relpath(src, local_dir).replace(os.sep, "/")
                self.put_file(src, *parts, rel)

    def rename(self, src: tuple[str, ...], dst: tuple[str, ...]) -> None:
        """Atomic on local disk (os.replace); elsewhere a copy of each file, then a delete."""
        s, d = self.path(*src), self.path(*dst)
        self._forget_tails(s)
        self._forget_tails(d)
        if self.is_local:
            self._call("rename", s, lambda: os.replace(s, d))
            return
        files = self._find(s)
        if not files:
            raise FileNotFoundError(f"cannot rename {self._url_of(s)}: it does not exist")
        for f in files:
            target = d if f == s else posixpath.join(d, posixpath.relpath(f, s))
            self._call("copy", target, lambda f=f, target=target: self.fs.cp_file(f, target))
        self.remove(*src)

    def remove(self, *parts: str) -> None:
        """Delete a file or a folder tree; missing is fine."""
        p = self.path(*parts)
        self._forget_tails(p)
        with contextlib.suppress(FileNotFoundError):
            self._call("remove", p, lambda: self.fs.rm(p, recursive=True))

    def remove_file(self, *parts: str) -> None:
        """Delete one file (one DELETE on object stores, no listing); missing is fine."""
        p = self.path(*parts)
        self._forget_tails(p)
        with contextlib.suppress(FileNotFoundError):
            self._call("remove", p, lambda: self.fs.rm_file(p))


# -- local-disk primitives (one attempt each; Storage._call retries and reports) ----


def _replace_file(target: str, data: bytes, durable: bool) -> None:
    """Write ``data`` to a temporary sibling, then rename it over ``target``.

    On any failure (a full disk included) the temporary file is removed and
    ``target`` keeps its previous content.
    """
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:  # a failed write leaves no temporary file behind
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def _append_file(target: str, data: bytes) -> int:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "ab") as f:
        f.write(data)
        f.flush()
        return f.tell()


def _truncate_file(target: str, length: int) -> None:
    if os.path.getsize(target) > length:  # never extend (as on object stores)
        with open(target, "r+b") as f:
            f.truncate(length)
