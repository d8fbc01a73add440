"""Local-disk writes, one attempt each (:meth:`Storage._call <popflow.infra.storage.folder.Storage>`
retries and reports): publish by rename, create by hard link, write in a private
folder, read a small regular file. (The derived logs' appends and cuts:
:mod:`popflow.infra.storage.log_writes`.)"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
import sys
import uuid
from collections.abc import Iterator


def staging_name(target: str) -> str:
    """A new temporary sibling of ``target`` (a resume's clean-up removes leftovers)."""
    return f"{target}.tmp-{uuid.uuid4().hex[:8]}"


@contextlib.contextmanager
def _staged(target: str, data: bytes, durable: bool) -> Iterator[str]:
    """``data`` in a temporary sibling of ``target`` (fsynced if ``durable``), removed
    afterwards whatever happens (a full disk included)."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = staging_name(target)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        yield tmp
    finally:
        with contextlib.suppress(OSError):
            os.remove(tmp)


def write_file(target: str, data: bytes, durable: bool) -> None:
    """Write ``data`` at ``target`` in place: for a folder no reader sees until it is
    published by a rename."""
    with open(target, "wb") as f:
        f.write(data)
        if durable:
            f.flush()
            os.fsync(f.fileno())


def replace_file(target: str, data: bytes, durable: bool) -> None:
    """Publish ``data`` at ``target`` by renaming a temporary sibling over it; on any
    failure ``target`` keeps its previous content."""
    with _staged(target, data, durable) as tmp:
        os.replace(tmp, target)


def create_file(target: str, data: bytes, durable: bool) -> bool:
    """Publish ``data`` at ``target`` by hard-linking a temporary sibling to it (atomic,
    and refused if ``target`` exists); False if it does."""
    with _staged(target, data, durable) as tmp:
        try:
            os.link(tmp, target)
        except FileExistsError:
            return False
        return True


def read_regular_file(target: str, limit: int) -> bytes | None:
    """At most ``limit + 1`` bytes of the regular file ``target`` (more than ``limit``
    tells the caller it is too big), or None if ``target`` is no regular file: a link,
    a FIFO, a socket, a folder. Opened without following a link and without blocking
    (a FIFO planted at a name popflow reads would hang a plain ``open``), and read no
    further than ``limit + 1`` bytes (a sparse file of any size fills no memory)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(target, flags)
    except OSError as e:
        # ELOOP (EMLINK on BSDs): a link, refused by O_NOFOLLOW; ENXIO: a socket
        if e.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO, errno.EISDIR):
            return None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 16))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


#: Open without following a link at the name, and without handing the descriptor to
#: child processes.
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)

#: renameat2's flags: refuse an existing target; swap two names atomically (Linux 3.15+;
#: ext4, tmpfs, xfs, btrfs)
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def exchange(a: str, b: str) -> bool:
    """Swap the files or folders at ``a`` and ``b`` in one step; False where the system
    cannot (nothing changed then). ``FileNotFoundError`` if either is missing."""
    fn = getattr(_libc, "renameat2", None)
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    if err == errno.ENOENT:
        raise FileNotFoundError(err, os.strerror(err), b)
    raise OSError(err, os.strerror(err), b)


def rename_new(a: str, b: str) -> None:
    """Move ``a`` to ``b``, which must not exist (``FileExistsError``, nothing moved):
    renameat2's no-replace where the system has it, else a look then a rename (a rename
    onto a folder that holds anything fails there too)."""
    fn = getattr(_libc, "renameat2", None)
    if fn is not None:
        if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise FileExistsError(err, os.strerror(err), b)
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), b)
    if os.path.lexists(b):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), b)
    try:
        os.rename(a, b)
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), b) from None
        raise


def read_prefix(fd: int, limit: int) -> bytes:
    """At most ``limit`` bytes from ``fd``."""
    chunks, left = [], limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    """All of ``data`` to ``fd`` (a write may take part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
