"""The derived logs on local disk, fenced by the file itself
(:mod:`popflow.infra.storage.log_writes` says why).

A log is written through a descriptor opened without following links, and only if it is
the file (device and inode) this writer created or adopted, at the size it left it. A
resume adopts each log by writing its kept part to a new file swapped in for the old
one (only if the old one is still the file it looked at), so a stalled older driver's
descriptor points at a file nobody reads any more: its late bytes go nowhere. Each
method is one attempt, run inside :meth:`Storage._call
<popflow.infra.storage.calls.StorageCalls._call>`; a log that is not as this writer left
it raises :class:`~popflow.infra.storage.errors.LogConflict`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass

from popflow.infra.storage import local_files
from popflow.infra.storage.errors import LogConflict
from popflow.infra.storage.safe_paths import UnsafePath

NOT_ADOPTED = (
    "it exists but this driver did not write it (a resume adopts the logs it goes on with first)"
)
REPLACED = "another driver adopted or replaced it since this one looked"


@dataclass
class Known:
    """A log as this writer left it."""

    dev: int
    ino: int
    size: int


@dataclass
class Seen:
    """A log as a resume looked at it: its file and the part it keeps."""

    dev: int
    ino: int
    data: bytes


class LocalLogs:
    """What one writer knows of its local logs, and the writes that depend on it."""

    def __init__(self) -> None:
        self.known: dict[str, Known] = {}

    def append(self, path: str, data: bytes) -> int:
        """Append ``data`` (a new log if this writer has none there and no one else has
        either); the log's new size."""
        known = self.known.get(path)
        if known is None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | local_files.NOFOLLOW
            try:
                fd = os.open(path, flags, 0o644)
            except FileExistsError:
                raise LogConflict(NOT_ADOPTED) from None
            size = 0
        else:
            fd = self.open_known(path, known)
            size = known.size
        try:
            st = os.fstat(fd)
            local_files.write_all(fd, data)
        except BaseException:
            self.known.pop(path, None)  # how much landed is unknown: adopt it again
            raise
        finally:
            os.close(fd)
        self.known[path] = Known(st.st_dev, st.st_ino, size + len(data))
        return size + len(data)

    def open_known(self, path: str, known: Known, flags: int = os.O_WRONLY | os.O_APPEND) -> int:
        """A descriptor of the file at ``path`` if it is the one this writer left, at the
        size it left it. A newer driver that replaced it after this check leaves this
        descriptor on a file no one reads: the write that follows lands there."""
        try:
            fd = os.open(path, flags | local_files.NOFOLLOW)
        except FileNotFoundError:
            raise LogConflict("it was removed") from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise LogConflict("it was replaced by a link") from None
            raise
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (known.dev, known.ino) or st.st_size != known.size:
            os.close(fd)
            raise LogConflict(
                f"it is not the file this driver left ({known.size} bytes): another driver "
                f"replaced or wrote it ({st.st_size} bytes now)"
            )
        return fd

    def cut(self, path: str, length: int) -> None:
        """Cut the log back to ``length`` bytes (never extends)."""
        known = self.known.get(path)
        if known is None:
            if os.path.lexists(path):
                raise LogConflict("it exists but this driver did not write it")
            return
        fd = self.open_known(path, known, os.O_WRONLY)
        try:
            if length < known.size:
                os.ftruncate(fd, length)
                known.size = length
        finally:
            os.close(fd)

    def replace(self, path: str, seen: Seen) -> None:
        """Put a new file holding ``seen.data`` at ``path`` if ``path`` is still the file
        ``seen`` looked at; record it as this writer's."""
        tmp = local_files.staging_name(path)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | local_files.NOFOLLOW, 0o644)
        try:
            local_files.write_all(fd, seen.data)
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
        self.known[path] = Known(st.st_dev, st.st_ino, len(seen.data))


def look(path: str, keep: int) -> Seen | None:
    """The log at ``path`` and its first ``keep`` bytes (None: not there); a link or
    anything but a file at its name is refused (:class:`UnsafePath`)."""
    refused = UnsafePath(
        f"{path} is a link or not a file: popflow never writes through a link, so it "
        "cannot leave the experiment's folder; remove it and resume"
    )
    try:
        fd = os.open(path, os.O_RDONLY | local_files.NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:  # a link planted at a log's name: never followed
            raise refused from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise refused
        return Seen(st.st_dev, st.st_ino, local_files.read_prefix(fd, keep))
    finally:
        os.close(fd)


def _swap_if(new: str, path: str, expected: tuple[int, int]) -> None:
    """Put ``new`` at ``path`` only if ``path`` is the file ``expected`` (device, inode);
    the old file ends at ``new``'s name. Where the system has no atomic exchange, a check
    and a rename (a stall between them is not fenced there)."""
    try:
        swapped = local_files.exchange(new, path)
    except FileNotFoundError:
        raise LogConflict("it was removed") from None
    if not swapped:
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) != expected:
            raise LogConflict(REPLACED)
        os.rename(new, path)
        return
    old = os.lstat(new)
    if (old.st_dev, old.st_ino) != expected:  # swapped out a newer driver's log: undo
        local_files.exchange(new, path)
        raise LogConflict(REPLACED)
