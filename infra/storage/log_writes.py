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
process: what a writer knows of its logs never travels to another process. The two
kinds of storage each keep their own book: :mod:`popflow.infra.storage.local_logs` and
:mod:`popflow.infra.storage.object_logs`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from popflow.infra.storage import local_logs
from popflow.infra.storage.errors import LogChanged, LogConflict
from popflow.infra.storage.local_logs import LocalLogs
from popflow.infra.storage.object_logs import ObjectLogs

__all__ = ["LogChanged", "LogWrites"]


class LogWrites:
    """What one writer knows of the logs it writes, and the writes that depend on it.

    ``call(op, path, fn, retry=...)``: :meth:`Storage._call
    <popflow.infra.storage.calls.StorageCalls._call>`; ``url_of(path)``: the URL to name
    in errors. ``fs``: an object store's filesystem (None: local disk); ``conditional``:
    it takes conditional PUTs (S3). A store with neither cannot fence: its writes are
    checked by size only, with a warning.
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
        self._book: LocalLogs | ObjectLogs = (
            LocalLogs() if fs is None else ObjectLogs(call, fs, conditional, url_of(""))
        )

    def forget(self, path: str) -> None:
        """Drop what is known at or under ``path`` (it is being replaced or removed)."""
        known = self._book.known
        for key in [k for k in known if k == path or k.startswith(path + "/")]:
            known.pop(key, None)

    @property
    def known(self) -> int:
        """How many logs this writer owns."""
        return len(self._book.known)

    def append(self, path: str, data: bytes) -> int:
        """Append ``data`` to the log at ``path`` (created if this writer has none there
        and no one else has either); its new size in bytes."""
        book = self._book
        try:
            if isinstance(book, LocalLogs):
                return self._call("append", path, lambda: book.append(path, data), retry=False)
            return book.append(path, data)
        except LogConflict as c:
            book.known.pop(path, None)
            raise LogChanged("append", self._url_of(path), str(c)) from None

    def cut(self, path: str, length: int) -> None:
        """Cut the log back to ``length`` bytes (never extends); a log this writer does not
        know and that is not there is fine."""
        book = self._book
        try:
            if isinstance(book, LocalLogs):
                self._call("truncate", path, lambda: book.cut(path, length), retry=False)
            else:
                book.cut(path, length)
        except LogConflict as c:
            book.known.pop(path, None)
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
        book = self._book
        book.known.pop(path, None)
        try:
            if isinstance(book, LocalLogs):
                seen = self._call("adopt", path, lambda: local_logs.look(path, keep), retry=False)
                guard()
                if seen is not None:
                    self._call("adopt", path, lambda: book.replace(path, seen), retry=False)
            else:
                got = book.get(path)
                guard()
                if got is not None:
                    book.adopt(path, keep, *got)
        except LogConflict as c:
            raise LogChanged("adopt", self._url_of(path), str(c)) from None
