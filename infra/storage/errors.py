"""Storage failures: the error popflow raises, and which failures are worth a retry.

A failure is classified once, here: an HTTP answer (botocore's ``ClientError``
shape, found anywhere in the exception's chain) decides by its status and
code; otherwise timeouts, connection errors and ``OSError`` with a transient
errno are transient. :class:`~popflow.infra.storage.folder.Storage` retries the
transient ones (:mod:`popflow.infra.storage.retry`) and raises :class:`StorageError`
for the rest.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator, Mapping
from typing import Any


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


class LogChanged(StorageError):
    """A derived log is not as its writer left it: another writer changed it (a newer
    driver, or a person). Nothing was written (:mod:`popflow.infra.storage.log_writes`)."""


class LogConflict(Exception):
    """Raised inside a storage call when a log is not as its writer left it (not an
    ``OSError``: never retried); :class:`LogChanged` is what callers see."""


#: errnos of a filesystem that holds no more (or nothing at all): a write into storage
#: made by user code (a checkpoint saved in place) failing so is storage's failure
FULL_ERRNOS = frozenset(
    getattr(errno, name) for name in ("ENOSPC", "EDQUOT", "EFBIG", "EROFS") if hasattr(errno, name)
)

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


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
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
    for link in exception_chain(exc):
        verdict = _http_verdict(link)
        if verdict is not None:
            return verdict
    for link in exception_chain(exc):
        if isinstance(link, TimeoutError | ConnectionError):
            return True
        if any(cls.__name__ in _TRANSIENT_CLASSES for cls in type(link).__mro__):
            return True
    if isinstance(exc, OSError):
        if exc.errno is not None:
            return exc.errno in _TRANSIENT_ERRNOS
        return remote and type(exc) is OSError  # not PermissionError, IsADirectoryError, ...
    return False


def error_code(exc: BaseException) -> str | None:
    """The error code of the HTTP answer behind ``exc`` (e.g. "PreconditionFailed"), if any."""
    for link in exception_chain(exc):
        response = _http_answer(link)
        if response is not None:
            return str(response["Error"].get("Code", ""))
    return None


def missing_bucket(exc: BaseException) -> str | None:
    """The bucket an object store answered does not exist (``NoSuchBucket`` anywhere in
    ``exc``'s chain; "" if the answer does not name it), or None: ``exc`` says otherwise.

    s3fs raises such an answer as a ``FileNotFoundError``, as it does for a missing
    object; but no retry and no "empty listing" makes a bucket appear.
    """
    for link in exception_chain(exc):
        response = _http_answer(link)
        if response is not None and response["Error"].get("Code") == "NoSuchBucket":
            return str(response["Error"].get("BucketName") or "")
    return None


def is_storage_failure(exc: BaseException) -> bool:
    """An error of the filesystem or its transport (vs a bug such as a TypeError)."""
    if isinstance(exc, OSError) or _http_verdict(exc) is not None:
        return True
    return type(exc).__module__.split(".")[0] in ("botocore", "aiobotocore", "aiohttp", "s3fs")
