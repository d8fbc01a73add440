"""The one place where :class:`~popflow.infra.storage.folder.Storage` makes filesystem calls.

:meth:`StorageCalls._call` runs each call:

- transient errors (timeouts, dropped connections, HTTP 5xx, throttling such
  as S3's ``SlowDown``; :mod:`popflow.infra.storage.errors` classifies) are
  retried with exponential backoff and jitter (:mod:`popflow.infra.storage.retry`),
  each retry logged at WARNING;
- a permanent error, or a transient one that outlasts the policy, raises
  :class:`StorageError` (an ``OSError``) naming the operation and the URL, its
  message free of credentials;
- ``FileNotFoundError`` passes through unchanged (a missing file or folder
  is an answer), except for a missing bucket: that raises :class:`StorageError`
  naming the bucket, at once, so a listing does not read it as empty;
  programming errors (``TypeError``, ``ValueError``) pass through too;
- on object stores the filesystem's listing cache is dropped for the path
  before and after each call, so a listing sees every write before it, also
  writes made by other processes (Dask workers).

Each call that is retried is idempotent (a whole PUT, a GET, a listing, a
delete that tolerates "already gone"), so a retry after an ambiguous failure
neither duplicates nor loses data.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from popflow.infra.storage.credentials import redact, secret_values
from popflow.infra.storage.errors import (
    StorageError,
    exception_chain,
    is_storage_failure,
    is_transient,
    missing_bucket,
)
from popflow.infra.storage.retry import OUTAGE_ATTEMPTS, RetryPolicy, backoff_delay

#: How far past its retries' deadline a call goes on while the lease shows storage answered
#: meanwhile (a call that began in an outage the lease outlived)
EXTENDED = 2.0

#: the retries are the storage's messages: logged under its module's name
logger = logging.getLogger(__name__)

T = TypeVar("T")


def _attempts(n: int) -> str:
    return "1 attempt" if n == 1 else f"{n} attempts"


def _limits(policy: RetryPolicy) -> str:
    """What ends ``policy``'s retries, in words."""
    if policy.attempts >= OUTAGE_ATTEMPTS:
        return f"{policy.deadline:g} s of retries"
    return f"at most {policy.attempts} attempts and {policy.deadline:g} s"


class StorageCalls:
    """What :class:`~popflow.infra.storage.folder.Storage` runs its filesystem calls with."""

    retry: RetryPolicy
    is_local: bool
    _rng: random.Random | None
    answered_within: Callable[[float], bool] | None
    lease_lost: Callable[[], BaseException | None] | None

    # provided by Storage
    fs: Any
    storage_options: dict[str, Any]
    _url_of: Callable[[str], str]

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
            lost = self.lease_lost() if self.lease_lost is not None else None
            if lost is not None:  # it writes nothing more; nor waits on an outage to exit
                raise lost
            self._forget(path)
            try:
                out = fn()
            except FileNotFoundError as e:
                if missing_bucket(e) is None:
                    raise
                failure = e  # not transient: raised below, naming the bucket
            except Exception as e:
                if not is_storage_failure(e):
                    raise  # a bug (TypeError, ValueError, ...), not a storage failure
                failure = e
            else:
                self._forget(path)
                return out
            # outside the except block: a failure quoting credentials is not chained
            delay = backoff_delay(attempt, policy, self._jitter())
            if not (retry and is_transient(failure, remote=not self.is_local)):
                raise self._error(op, path, failure, "")
            spent = time.monotonic() - start
            if (attempt >= policy.attempts or spent + delay > policy.deadline) and not (
                self._lease_answered(spent) and spent + delay <= EXTENDED * policy.deadline
            ):
                raise self._error(
                    op, path, failure, f" (gave up after {_attempts(attempt)} in {spent:.1f} s)"
                )
            logger.warning(
                "storage %s of %s failed (attempt %d, %.1f s into %s): %s; retrying in %.2f s",
                op,
                self._url_of(path),
                attempt,
                spent,
                _limits(policy),
                self._describe(failure),
                delay,
            )
            time.sleep(delay)

    def _lease_answered(self, seconds: float) -> bool:
        """Storage answered the driver's lease within the last ``seconds`` (a call that
        ran out of retries after an outage that has ended gets more), and it holds."""
        return self.answered_within is not None and self.answered_within(seconds)

    def _describe(self, exc: BaseException) -> str:
        return redact(f"{type(exc).__name__}: {exc}", self._secrets())

    def _error(self, op: str, path: str, exc: BaseException, note: str) -> StorageError:
        """The StorageError for ``exc``; chained to it unless its chain quotes a credential."""
        code = exc.errno if isinstance(exc, OSError) else None
        reason = self._describe(exc)
        bucket = missing_bucket(exc)
        if bucket is not None:
            bucket = bucket or path.split("/", 1)[0]
            reason = f"the bucket {bucket!r} does not exist ({reason})"
        error = StorageError(op, self._url_of(path), reason + note, code)
        secrets = self._secrets()
        if not any(s in str(link) for link in exception_chain(exc) for s in secrets):
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
