"""Local-disk writes, one attempt each (:meth:`Storage._call <popflow.infra.storage.folder.Storage>`
retries and reports): publish by rename, create by hard link, write in a private
folder, read a small regular file. (The derived logs' appends and cuts:
:mod:`popflow.infra.storage.log_writes`.)"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
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
