"""``RunConfig(log_to_file=...)``: a trial's stdout and stderr, also written to files in
its folder, as Ray writes them (``True``: ``stdout`` and ``stderr``; a name: both into
one file; a pair: ``(stdout name, stderr name)``).

What is caught is Python-level output, as in Ray (it swaps ``sys.stdout``/``sys.stderr``
in the trial's actor): ``print`` and anything else writing to ``sys.stdout`` or
``sys.stderr`` while a segment of the trial runs, in the segment's thread and a function
trainable's own thread (both are bound to the trial: :mod:`popflow.tasks.trial_context`).
Output written straight to file descriptors 1 and 2 (C extensions) and output from
threads the trainable starts itself is not caught: several trials may share a worker
process (live trainables wait there between segments), so only output known to be the
trial's own is routed to its files. The output still reaches the worker's own streams.

Files are appended to, never overwritten: across segments, restores and resumes the
files grow. On local storage they are written as the trial writes (line-buffered); on an
object store each segment's output is spooled to a local file and appended to the
stored one every :data:`UPLOAD_EVERY_S` seconds and when the segment ends (one read and
one write of the object each time: a trial's segments run one at a time).
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from typing import IO, Any

from popflow.infra.storage.folder import Storage
from popflow.infra.store.layout import (
    CHECKPOINT_PREFIX,
    ERROR_FILE,
    GLOBAL_POLICY,
    LOG_DIR,
    PARAMS,
    PROGRESS,
    RESULTS,
)
from popflow.tasks.trial_context import get_context

logger = logging.getLogger(__name__)

#: names popflow writes in a trial's folder itself: no output file may take them
_OURS = (RESULTS, PROGRESS, PARAMS, ERROR_FILE, GLOBAL_POLICY, LOG_DIR)

STDOUT, STDERR = 0, 1

#: on an object store, a running segment's new output is appended this often (a FIFO
#: run's trial is one segment: its output would otherwise wait for its end)
UPLOAD_EVERY_S = 30.0


def log_files(log_to_file: Any) -> tuple[str | None, str | None]:
    """``log_to_file`` as the names of the files (in the trial's folder) that take the
    trial's stdout and stderr (None: not kept), checked as Ray's ``_validate_log_to_file``
    does, and each a relative path that stays in the trial's folder."""
    if not log_to_file:
        return None, None
    if log_to_file is True:
        return "stdout", "stderr"
    if isinstance(log_to_file, str):
        names: tuple[Any, Any] = (log_to_file, log_to_file)
    elif isinstance(log_to_file, Sequence):
        if len(log_to_file) != 2:
            raise ValueError(
                f"`log_to_file` is {log_to_file!r}, but a sequence must hold 2 names (the "
                f"files of stdout and stderr), not {len(log_to_file)}"
            )
        names = (log_to_file[0], log_to_file[1])
    else:
        raise TypeError(
            f"`log_to_file` is {log_to_file!r}, but must be a bool, a file name or a pair "
            "of file names (stdout's, stderr's)"
        )
    for name in names:
        _check_name(log_to_file, name)
    return names[0] or None, names[1] or None


def _check_name(log_to_file: Any, name: Any) -> None:
    if name is None or name == "":  # Ray: that stream is not kept
        return
    if not isinstance(name, str):
        raise TypeError(f"`log_to_file` is {log_to_file!r}, but {name!r} is not a file name")
    parts = name.replace("\\", "/").split("/")
    if posixpath.isabs(name) or ".." in parts or not parts[-1]:
        raise ValueError(
            f"`log_to_file` is {log_to_file!r}, but {name!r} is not a file name in the "
            "trial's folder (a relative path, without '..')"
        )
    if parts[0] in _OURS or parts[0].startswith(CHECKPOINT_PREFIX):
        raise ValueError(
            f"`log_to_file` is {log_to_file!r}, but popflow writes {parts[0]!r} in the "
            "trial's folder itself: choose another name"
        )


class TrialOutput:
    """The files one trial's output goes to while one of its segments runs."""

    def __init__(self, storage: Storage, trial_dir: str, names: tuple[str | None, str | None]):
        self.storage = storage
        self.trial_dir = trial_dir
        self._lock = threading.Lock()  # stdout and stderr may share a file
        self._files: dict[str, IO[str]] = {}  # by name: the trial's file, or its spool
        self._spools: dict[str, str] = {}  # object stores: name -> local spool path
        self._sent: dict[str, int] = {}  # bytes of each spool already appended to storage
        self._streams: list[IO[str] | None] = [self._open(name) for name in names]
        self._failed = False
        self._upload_lock = threading.Lock()  # one append to storage at a time
        self._closing = threading.Event()
        self._uploader: threading.Thread | None = None
        if self._spools:
            self._uploader = threading.Thread(
                target=self._upload_now_and_then, name=f"output-{trial_dir}", daemon=True
            )
            self._uploader.start()

    def _open(self, name: str | None) -> IO[str] | None:
        if name is None:
            return None
        if name in self._files:
            return self._files[name]
        if self.storage.is_local:
            path = self.storage.path(self.trial_dir, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            # line-buffered: the file follows the trial's output as it prints
            f = open(path, "a", encoding="utf-8", errors="replace", buffering=1)  # noqa: SIM115
        else:
            fd, spool = tempfile.mkstemp(prefix="popflow-output-")
            self._spools[name] = spool
            self._sent[name] = 0
            f = open(fd, "w", encoding="utf-8", errors="replace")  # noqa: SIM115
        self._files[name] = f
        return f

    def write(self, stream: int, text: str) -> None:
        f = self._streams[stream]
        if f is None or self._failed:
            return
        with self._lock:
            try:
                f.write(text)
            except (OSError, ValueError) as exc:  # a full disk: the trial goes on untold
                self._failed = True
                _quietly(logger.warning, "trial output not kept in %s: %s", self.trial_dir, exc)

    def close(self) -> None:
        """Close the files; on an object store, append what is left of the spooled output
        to the stored files (a failure is logged: losing output never fails the trial)."""
        self._closing.set()
        if self._uploader is not None:
            self._uploader.join()
        with self._lock:
            for f in self._files.values():
                with contextlib.suppress(OSError, ValueError):
                    f.close()
        self._upload(final=True)
        for spool in self._spools.values():
            with contextlib.suppress(OSError):
                os.remove(spool)

    def _upload_now_and_then(self) -> None:
        while not self._closing.wait(UPLOAD_EVERY_S):
            self._upload(final=False)

    def _upload(self, final: bool) -> None:
        """Append each spool's output not sent yet to its stored file."""
        with self._upload_lock:
            for name, spool in self._spools.items():
                # what the trial wrote so far reaches the spool
                with self._lock, contextlib.suppress(OSError, ValueError):
                    self._files[name].flush()
                try:
                    with open(spool, "rb") as f:
                        f.seek(self._sent[name])
                        new = f.read()
                    if new:
                        self._append_stored(name, new)
                        self._sent[name] += len(new)
                except Exception:  # kept in the spool: the next upload tries again
                    log = logger.warning if final else logger.info
                    _quietly(
                        log,
                        "trial output in %s did not reach %s%s",
                        self.trial_dir,
                        self.storage.full_url(self.trial_dir, name),
                        "" if final else " (tried again later)",
                        exc_info=True,
                    )

    def _append_stored(self, name: str, new: bytes) -> None:
        parts = (self.trial_dir, name)
        old = self.storage.read_bytes(*parts) if self.storage.file_exists(*parts) else b""
        self.storage.write_bytes(old + new, *parts)


# -- the process's streams -----------------------------------------------------------

_active: dict[str, TrialOutput] = {}  # trial id -> its output, while a segment runs
_active_lock = threading.Lock()
_busy = threading.local()  # a write to a trial's file is under way in this thread


class _Tee:
    """``sys.stdout`` or ``sys.stderr`` while trials keep their output: what a trial's
    thread writes goes to its files too; everything goes on to the original stream."""

    def __init__(self, original: Any, stream: int) -> None:
        self._original = original
        self._stream = stream

    def write(self, text: str) -> int:
        if getattr(_busy, "on", False):  # a _Tee under another (a stream swapped in over
            return self._pass_on(text)  # ours), or a warning logged from within: kept once
        _busy.on = True
        try:
            output = _output_of_this_thread()
            if output is not None and isinstance(text, str):
                output.write(self._stream, text)
            return self._pass_on(text)
        finally:
            _busy.on = False

    def _pass_on(self, text: str) -> int:
        if self._original is None:  # no console at all (pythonw): print() writes nothing
            return len(text)
        return self._original.write(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self._original is not None:
            self._original.flush()

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, isatty, buffer ...
        return getattr(self._original, name)


def _output_of_this_thread() -> TrialOutput | None:
    if not _active:
        return None
    try:
        trial_id = get_context().trial_id
    except RuntimeError:  # not a trial's thread: a worker's own output
        return None
    return _active.get(trial_id)


def _quietly(log: Any, *args: Any, **kwargs: Any) -> None:
    before, _busy.on = getattr(_busy, "on", False), True
    try:
        log(*args, **kwargs)
    finally:
        _busy.on = before


def _install() -> None:
    if not isinstance(sys.stdout, _Tee):
        sys.stdout = _Tee(sys.stdout, STDOUT)
    if not isinstance(sys.stderr, _Tee):
        sys.stderr = _Tee(sys.stderr, STDERR)


def _uninstall() -> None:
    # only our own: a stream someone swapped in since is theirs
    if isinstance(sys.stdout, _Tee):
        sys.stdout = sys.stdout._original
    if isinstance(sys.stderr, _Tee):
        sys.stderr = sys.stderr._original


@contextlib.contextmanager
def captured(log_to_file: Any, storage: Storage, trial_dir: str, trial_id: str) -> Iterator[None]:
    """While the block runs, ``trial_id``'s output also goes to the files ``log_to_file``
    names in its folder (nothing if it names none)."""
    names = log_files(log_to_file)
    if names == (None, None):
        yield
        return
    output = TrialOutput(storage, trial_dir, names)
    with _active_lock:
        _active[trial_id] = output
        _install()
    try:
        yield
    finally:
        with _active_lock:
            _active.pop(trial_id, None)
            if not _active:
                _uninstall()
        output.close()
