"""Fenced writes to the derived logs: a writer changes only the log it left.

The derived logs (``result.json``, ``progress.csv``, ``pbt_global.txt``) grow by appends
and are sometimes cut back. Checking the lease before each write is not enough: a driver
stopped right after its check (SIGSTOP, a long pause) wakes after a newer driver took
over and would write on top of the newer driver's lines. So each write here carries
what its writer last knew of the log, and lands only if the log is still that:

- **object stores**: every write is one PUT conditional on the ETag this writer last
  saw (``If-Match``). A writer that has not seen the log yet reads its ETag and size
  first, and goes on only if the size is the one it expects (:meth:`LogWrites.adopt`
  at a resume records them). There is no read-then-rewrite: a log changed by someone
  else is never written over.
- **local disk**: a log is written through a descriptor opened without following
  links, and only if it is the file (device and inode) this writer created or adopted,
  at the size it left it. A resume adopts each log by writing its kept part to a new
  file renamed over the old one, so a stalled older driver's descriptor points at a
  file nobody reads any more: its late bytes go nowhere.

A write that finds the log changed raises :class:`LogChanged`; the log writer then
looks at the lease (a driver taken over stops with ``LeaseLost``, having written
nothing), and a driver that still holds it stops with the error: ``popflow resume``
cuts the logs back to the commits and appends what they hold.

One :class:`LogWrites` per :class:`~popflow.infra.storage.folder.Storage` object and
process: what a writer knows of its logs never travels to another process.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import stat
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fsspec.asyn import sync

from popflow.infra.storage import local_files
from popflow.infra.storage.errors import StorageError, error_code
from popflow.infra.storage.safe_paths import UnsafePath

logger = logging.getLogger(__name__)

#: A log larger than this is not kept in memory between appends: its next append reads
#: it back (conditionally) instead.
CONTENT_LIMIT = 8 << 20

#: Open a log without following a link at its name (never write through a link out of
#: the experiment), and without handing the descriptor to child processes.
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class LogChanged(StorageError):
    """A derived log is not as this writer left it: another writer changed it (a newer
    driver, or a person). Nothing was written."""

    def __init__(self, operation: str, url: str, reason: str, code: int | None = None) -> None:
        super().__init__(operation, url, reason, code)


class _Conflict(Exception):
    """Raised inside a storage call (not an ``OSError``, so it is not retried)."""


@dataclass
class _Local:
    dev: int
    ino: int
    size: int


@dataclass
class _Object:
    etag: str
    size: int
    content: bytes | None  # None: over CONTENT_LIMIT, read back before the next write


class LogWrites:
    """What one writer knows of the logs it writes, and the writes that depend on it.

    ``call(op, path, fn, retry=...)``: :meth:`Storage._call
    <popflow.infra.storage.calls.StorageCalls._call>`; ``url_of(path)``: the URL to name
    in errors. ``s3``: an S3 filesystem (``fs``) that takes conditional PUTs, else
    local disk. A store with neither cannot fence: its writes are checked by size only,
    with a warning.
    """

    def __init__(
        self,
        call: Callable[..., Any],
        url_of: Callable[[str], str],
        fs: Any = None,
        conditional: bool = False,
    ) -> None:
        self._call = call
        self._url_of = url_of
        self._fs = fs
        self._local = fs is None
        self._conditional = conditional
        self._known: dict[str, _Local | _Object] = {}
        self._warned = False

    def forget(self, path: str) -> None:
        """Drop what is known at or under ``path`` (it is being replaced or removed)."""
        known = self._known
        for key in [k for k in known if k == path or k.startswith(path + "/")]:
            known.pop(key, None)

    @property
    def known(self) -> int:
        """How many logs this writer owns."""
        return len(self._known)

    # -- the three operations ----------------------------------------------------------
    def append(self, path: str, data: bytes) -> int:
        """Append ``data`` to the log at ``path`` (created if this writer has none there
        and no one else has either); its new size in bytes."""
        try:
            if self._local:
                return self._call(
                    "append", path, lambda: self._append_local(path, data), retry=False
                )
            return self._append_object(path, data)
        except _Conflict as c:
            self._known.pop(path, None)
            raise LogChanged("append", self._url_of(path), str(c)) from None

    def cut(self, path: str, length: int) -> None:
        """Cut the log back to ``length`` bytes (never extends); a log this writer does not
        know and that is not there is fine."""
        try:
            if self._local:
                self._call("truncate", path, lambda: self._cut_local(path, length), retry=False)
            else:
                self._cut_object(path, length)
        except _Conflict as c:
            self._known.pop(path, None)
            raise LogChanged("truncate", self._url_of(path), str(c)) from None

    def adopt(self, path: str, keep: int, guard: Callable[[], None] = lambda: None) -> None:
        """Take the log at ``path`` over for this writer, cut back to at most ``keep``
        bytes (a resume, under the lease it just took): from now on only this writer's
        writes land on it. Missing is fine (a later append creates it).

        In two steps around ``guard`` (the lease check): the log is looked at first, then
        the lease checked, then the log replaced only if it is still the one looked at
        (local disk: an atomic exchange, undone if it was not; object stores: a PUT
        conditional on the ETag read). A driver stalled after its check, woken after a
        newer driver adopted the log, so changes nothing.
        """
        self._known.pop(path, None)
        try:
            if self._local:
                seen = self._call("adopt", path, lambda: _look_local(path, keep), retry=False)
                guard()
                if seen is not None:
                    self._call("adopt", path, lambda: self._replace_local(path, seen), retry=False)
            else:
                got = self._get(path)
                guard()
                if got is not None:
                    self._adopt_object(path, keep, *got)
        except _Conflict as c:
            raise LogChanged("adopt", self._url_of(path), str(c)) from None

    # -- local disk ------------------------------------------------------------------
    def _append_local(self, path: str, data: bytes) -> int:
        known = self._known.get(path)
        if known is None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            try:
                fd = os.open(
                    path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644
                )
            except FileExistsError:
                raise _Conflict(
                    "it exists but this driver did not write it (a resume adopts the logs it "
                    "goes on with first)"
                ) from None
            size = 0
        else:
            assert isinstance(known, _Local)
            fd = self._open_known(path, known)
            size = known.size
        try:
            st = os.fstat(fd)
            _write_all(fd, data)
        except BaseException:
            self._known.pop(path, None)  # how much landed is unknown: adopt it again
            raise
        finally:
            os.close(fd)
        self._known[path] = _Local(st.st_dev, st.st_ino, size + len(data))
        return size + len(data)

    def _open_known(self, path: str, known: _Local, flags: int = os.O_WRONLY | os.O_APPEND) -> int:
        """A descriptor of the file at ``path`` if it is the one this writer left, at the
        size it left it. A newer driver that replaced it after this check leaves this
        descriptor on a file no one reads: the write that follows lands there."""
        try:
            fd = os.open(path, flags | _NOFOLLOW)
        except FileNotFoundError:
            raise _Conflict("it was removed") from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise _Conflict("it was replaced by a link") from None
            raise
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (known.dev, known.ino) or st.st_size != known.size:
            os.close(fd)
            raise _Conflict(
                f"it is not the file this driver left ({known.size} bytes): another driver "
                f"replaced or wrote it ({st.st_size} bytes now)"
            )
        return fd

    def _cut_local(self, path: str, length: int) -> None:
        known = self._known.get(path)
        if known is None:
            if os.path.lexists(path):
                raise _Conflict("it exists but this driver did not write it")
            return
        assert isinstance(known, _Local)
        fd = self._open_known(path, known, os.O_WRONLY)
        try:
            if length < known.size:
                os.ftruncate(fd, length)
                known.size = length
        finally:
            os.close(fd)

    def _replace_local(self, path: str, seen: _Seen) -> None:
        """Put a new file holding ``seen.data`` at ``path`` if ``path`` is still the file
        ``seen`` looked at; record it as this writer's."""
        tmp = local_files.staging_name(path)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
        try:
            _write_all(fd, seen.data)
            st = os.fstat(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
        os.close(fd)
        try:
            _swap_if(tmp, path, (seen.dev, seen.ino))
        finally:
            with contextlib.suppress(OSError):
                os.remove(tmp)  # the old file, exchanged out (or ours, not swapped in)
        self._known[path] = _Local(st.st_dev, st.st_ino, len(seen.data))

    # -- object stores -----------------------------------------------------------------
    def _append_object(self, path: str, data: bytes) -> int:
        known = self._known.get(path)
        if known is None:
            if self._create_object(path, data):
                return len(data)
            raise _Conflict(
                "it exists but this driver did not write it (a resume adopts the logs it "
                "goes on with first)"
            )
        assert isinstance(known, _Object)
        old = known.content if known.content is not None else self._read_known(path, known)
        self._put_if(path, old + data, known.etag, "append")
        return len(old) + len(data)

    def _cut_object(self, path: str, length: int) -> None:
        known = self._known.get(path)
        if known is None:
            if self._head(path) is not None:
                raise _Conflict("it exists but this driver did not write it")
            return
        assert isinstance(known, _Object)
        if length >= known.size:
            return
        old = known.content if known.content is not None else self._read_known(path, known)
        self._put_if(path, old[:length], known.etag, "truncate")

    def _adopt_object(self, path: str, keep: int, data: bytes, etag: str) -> None:
        if len(data) > keep:
            self._known[path] = _Object(etag, len(data), None)  # the expectation of the cut
            self._put_if(path, data[:keep], etag, "adopt")
        else:
            self._remember(path, etag, data)

    def _create_object(self, path: str, data: bytes) -> bool:
        if not self._conditional:
            return self._create_unconditionally(path, data)
        attempts = 0

        def put() -> Any:
            nonlocal attempts
            attempts += 1
            try:
                return self._fs.pipe_file(path, data, IfNoneMatch="*")
            except OSError as e:
                code = error_code(e)
                if code in ("PreconditionFailed", "ConditionalRequestConflict"):
                    return None
                if code == "NotImplemented" and attempts == 1:
                    return _NoConditional
                raise

        out = self._call("append", path, put)
        if out is _NoConditional:
            self._conditional = False
            return self._create_unconditionally(path, data)
        if out is None:
            if attempts > 1:  # an earlier attempt had landed and its answer was lost
                got = self._get(path)
                if got is not None and got[0] == data:
                    self._remember(path, got[1], data)
                    return True
            return False
        self._remember(path, _etag(out), data)
        return True

    def _put_if(self, path: str, content: bytes, etag: str, op: str) -> None:
        """One PUT of ``content``, landing only if the object's ETag is still ``etag``."""
        if not self._conditional:
            self._put_checked_by_size(path, content, op)
            return
        attempts = 0

        def put() -> Any:
            nonlocal attempts
            attempts += 1
            try:
                return self._fs.pipe_file(path, content, IfMatch=etag)
            except FileNotFoundError:
                return _Missing
            except OSError as e:
                code = error_code(e)
                if code in ("PreconditionFailed", "ConditionalRequestConflict"):
                    return None
                if code == "NotImplemented" and attempts == 1:
                    return _NoConditional
                raise

        out = self._call(op, path, put)
        if out is _NoConditional:  # a store without If-Match: fenced by size from now on
            self._conditional = False
            self._put_checked_by_size(path, content, op)
            return
        if out is _Missing:
            raise _Conflict("it was removed")
        if out is None:
            got = self._get(path) if attempts > 1 else None
            if got is not None and got[0] == content:  # an earlier attempt had landed
                self._remember(path, got[1], content)
                return
            raise _Conflict("another driver wrote it since this one did (its ETag changed)")
        self._remember(path, _etag(out), content)

    def _read_known(self, path: str, known: _Object) -> bytes:
        """The content of a log too large to keep in memory, if it is still the one
        this writer left."""
        got = self._get(path)
        if got is None:
            raise _Conflict("it was removed")
        data, etag = got
        if etag != known.etag or len(data) != known.size:
            raise _Conflict("another driver wrote it since this one did (its ETag changed)")
        return data

    def _get(self, path: str) -> tuple[bytes, str] | None:
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
        self._known[path] = _Object(etag, len(content), keep)

    # -- stores without conditional PUTs ---------------------------------------------
    def _warn_unfenced(self) -> None:
        if not self._warned:
            logger.warning(
                "%s has no conditional PUT (If-Match): a driver stalled past its lease could "
                "still write one log line after a newer driver's",
                self._url_of(""),
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
        known = self._known.get(path)
        size = self._call("size", path, lambda: self._fs.size(path))
        if known is not None and size != known.size:
            raise _Conflict(f"it is {size} bytes, not the {known.size} this driver left")
        out = self._call(op, path, lambda: self._fs.pipe_file(path, content))
        self._remember(path, _etag(out), content)


class _Refused(UnsafePath):
    """A log's name holds a link or something other than a file."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"{path} is a link or not a file: popflow never writes through a link, so it "
            "cannot leave the experiment's folder; remove it and resume"
        )


@dataclass
class _Seen:
    """A local log as a resume looked at it: its file and the part it keeps."""

    dev: int
    ino: int
    data: bytes


def _look_local(path: str, keep: int) -> _Seen | None:
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:  # a link planted at a log's name: never followed
            raise _Refused(path) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Refused(path)
        return _Seen(st.st_dev, st.st_ino, _read_prefix(fd, keep))
    finally:
        os.close(fd)


#: renameat2's flag: swap two names atomically (Linux 3.15+; ext4, tmpfs, xfs, btrfs)
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def exchange(a: str, b: str) -> bool:
    """Swap the files at ``a`` and ``b`` in one step; False where the system cannot."""
    fn = getattr(_libc, "renameat2", None)
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    if err == errno.ENOENT:
        raise _Conflict("it was removed")
    raise OSError(err, os.strerror(err), b)


def _swap_if(new: str, path: str, expected: tuple[int, int]) -> None:
    """Put ``new`` at ``path`` only if ``path`` is the file ``expected`` (device, inode);
    the old file ends at ``new``'s name. Where the system has no atomic exchange, a check
    and a rename (a stall between them is not fenced there)."""
    if not exchange(new, path):
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) != expected:
            raise _Conflict("another driver adopted or replaced it since this one looked")
        os.rename(new, path)
        return
    old = os.lstat(new)
    if (old.st_dev, old.st_ino) != expected:  # swapped out a newer driver's log: undo
        exchange(new, path)
        raise _Conflict("another driver adopted or replaced it since this one looked")


_Missing = object()
_NoConditional = object()


def _etag(put_response: Any) -> str:
    return str(put_response.get("ETag", "")) if isinstance(put_response, Mapping) else ""


def _read_prefix(fd: int, limit: int) -> bytes:
    chunks, left = [], limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
