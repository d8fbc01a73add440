"""Storage through fsspec URLs: a plain path means a local folder, ``s3://`` means S3.

A :class:`Storage` is picklable (URL + options; the filesystem is created
lazily per process), so the driver hands the same object to Dask workers.
Every write that others may read is published atomically:

- local: write to a temporary sibling, then ``os.replace`` (atomic rename);
- object stores: a single PUT is atomic per object, and multi-object
  artefacts (checkpoints) become visible through a manifest written last
  (see :mod:`popflow.infra.store.checkpoints`).

Every filesystem call goes through one helper,
:meth:`~popflow.infra.storage.calls.StorageCalls._call`, which retries transient
failures and reports the rest as :class:`StorageError` naming the operation and
the URL (:mod:`popflow.infra.storage.calls`). Appends to the derived logs are fenced:
each lands only on the log its writer left (:mod:`popflow.infra.storage.log_writes`).

Credentials in ``storage_options`` never appear in reprs, log records or
error messages (:mod:`popflow.infra.storage.credentials` masks them wherever a message
quotes an underlying error), and a Storage passed as a Prefect flow parameter
is recorded as ``"<Storage>"``.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import random
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from popflow.infra.storage import local_files
from popflow.infra.storage.calls import StorageCalls
from popflow.infra.storage.credentials import Hidden
from popflow.infra.storage.errors import StorageError
from popflow.infra.storage.log_writes import LogChanged, LogWrites
from popflow.infra.storage.object_writes import ObjectWrites
from popflow.infra.storage.retry import RetryPolicy
from popflow.infra.storage.s3_attempts import filesystem, url_to_fs
from popflow.infra.storage.safe_paths import UnsafePath, escapes, leads_out

__all__ = ["LogChanged", "RetryPolicy", "Storage", "StorageError", "UnsafePath"]


#: An object-store transfer's part size and parts in flight (:meth:`Storage._parts`)
PART_BYTES = 8 << 20
PART_CONCURRENCY = 4


class Storage(StorageCalls):
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
        storage_options: Mapping[str, Any] | Hidden | None = None,
        retry: RetryPolicy | None = None,
    ):
        url = os.fspath(url)
        if not url:
            raise ValueError(
                "`storage` is empty; give a local folder or a URL such as s3://bucket/prefix"
            )
        self._options = Hidden(storage_options)  # a RunConfig's StorageOptions too
        self.retry = retry or RetryPolicy()
        fs, root = url_to_fs(url, self.storage_options)
        self.protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self.is_local = isinstance(fs, LocalFileSystem)
        # s3fs asks for an object's size (a HEAD) before each GET, to split big
        # downloads; whole small objects (logs, commits, manifests) need one GET
        s3 = self.protocol in ("s3", "s3a")
        self._read_kwargs = {"max_concurrency": 1} if s3 else {}
        self._conditional_puts = s3  # If-Match on PUT: appends skip the read
        self._appends: ObjectWrites | None = None  # made per process, on first use
        self._logs: LogWrites | None = None  # the logs this object wrote, per process
        self.root = os.path.abspath(root) if self.is_local else root.rstrip("/")
        self._fs: fsspec.AbstractFileSystem | None = fs
        self._rng: random.Random | None = None
        #: the driver's lease, when it holds one: retries go on past their deadline while it
        #: was proven since the call began (StorageCalls._call); this process's only
        self.answered_within: Callable[[float], bool] | None = None
        #: the driver's LeaseLost once it lost its lease (None: it holds): raised instead of
        #: any call after that
        self.lease_lost: Callable[[], BaseException | None] | None = None

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
        state["answered_within"] = None  # the driver's lease stays with the driver
        state["lease_lost"] = None
        state["_appends"] = None
        state["_logs"] = None  # what a writer knows of its logs stays with it
        return state

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        if self._fs is None:
            self._fs = filesystem(self.protocol, self.storage_options)
        return self._fs

    def child(self, *parts: str) -> Storage:
        """A Storage rooted at a sub-folder."""
        sub = Storage.__new__(Storage)
        sub.__dict__.update(self.__getstate__())
        sub.root = self.path(*parts)
        sub._fs = self._fs
        return sub

    def path(self, *parts: str) -> str:
        """Absolute filesystem path of ``parts`` under the root.

        :class:`UnsafePath` (a ``ValueError``) for a path that would leave the root: an
        absolute part, or ``..`` parts that climb above it. No read, write or delete
        through this Storage reaches outside its root, whatever a stored name says.
        """
        if not parts:
            return self.root
        for part in parts:
            if part.startswith("/"):  # posixpath.join would drop the root and escape it
                raise UnsafePath(
                    f"storage path part {part!r} is absolute; give paths relative to {self.url}"
                )
        joined = posixpath.join(self.root, *parts)
        if any(".." in part for part in parts) and escapes(self.root, joined):
            raise UnsafePath(
                f"storage path {'/'.join(parts)!r} leaves {self.url}; popflow reads, writes "
                "and deletes only inside it"
            )
        real = leads_out(self.root, parts) if self.is_local else None
        if real is not None:  # a trial folder planted as a link to another folder, say
            raise UnsafePath(
                f"storage path {'/'.join(parts)!r} under {self.url} goes through a link "
                f"to {real}, outside it; popflow never follows a link out of its folder: "
                "remove the link"
            )
        return joined

    def full_url(self, *parts: str) -> str:
        return self._url_of(self.path(*parts))

    def _url_of(self, path: str) -> str:
        return path if self.is_local else f"{self.protocol}://{path}"

    # -- reads -------------------------------------------------------------------
    def exists(self, *parts: str) -> bool:
        p = self.path(*parts)
        return self._call("exists", p, lambda: self.fs.exists(p))

    def file_exists(self, *parts: str) -> bool:
        """Whether the file ``parts`` exists: one HEAD on S3 (``exists`` also lists, to
        find folders: twice the requests for a name that is not there)."""
        p = self.path(*parts)
        if not self._conditional_puts:  # local disk, and stores without S3's API
            return self._call("exists", p, lambda: self.fs.isfile(p))
        bucket, key, _ = self.fs.split_path(p)

        def head() -> bool:
            try:
                self.fs.call_s3("head_object", Bucket=bucket, Key=key)
            except FileNotFoundError:
                return False
            return True

        return self._call("exists", p, head)

    def read_bytes(self, *parts: str) -> bytes:
        p = self.path(*parts)
        return self._call("read", p, lambda: self._read_object(p))

    def read_text(self, *parts: str) -> str:
        return self.read_bytes(*parts).decode("utf-8")

    def _read_object(self, path: str) -> bytes:
        return self.fs.cat_file(path, **self._read_kwargs)

    def _put_object(self, path: str, data: bytes, **kwargs: Any) -> Any:
        return self.fs.pipe_file(path, data, **kwargs)

    def size(self, *parts: str) -> int:
        p = self.path(*parts)
        return int(self._call("size", p, lambda: self.fs.size(p)))

    def modified(self, *parts: str) -> float:
        """When the file ``parts`` was last written, in seconds since the epoch, by the
        storage's clock (an object's LastModified; a local file's mtime)."""
        p = self.path(*parts)
        return self._call("stat", p, lambda: self.fs.modified(p).timestamp())

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
        """Download one file to ``local_path`` (its folder must exist), streamed."""
        p = self.path(*parts)
        self._call("download", p, lambda: self.fs.get_file(p, local_path, **self._parts()))

    def _parts(self) -> dict[str, Any]:
        """How an S3 transfer streams: parts of ``PART_BYTES``, ``PART_CONCURRENCY`` at a
        time. s3fs's defaults (50 MiB parts, 10 at a time, and a file under two parts
        read whole) held up to 500 MiB of one 100 MB checkpoint in memory; these hold 32
        MiB, as many parts as the AWS CLI's."""
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        if "s3" not in protocols:
            return {}
        return {"chunksize": PART_BYTES, "max_concurrency": PART_CONCURRENCY}

    def get_dir(self, local_dir: str, *parts: str) -> None:
        """Copy the files under ``parts`` into a local folder."""
        for rel in self.walk_files(*parts):
            dst = os.path.join(local_dir, *rel.split("/"))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            self.get_file(dst, *parts, rel)

    # -- writes ------------------------------------------------------------------
    def write_bytes(
        self, data: bytes, *parts: str, durable: bool = False, private: bool = False
    ) -> None:
        """Publish ``data`` atomically: readers see the old object or the new one.

        ``durable``: on local disk, also fsync before the rename, so the object
        survives a machine crash, not only a process crash (commits use it;
        checkpoints rely on their checksums instead, which are checked on load).
        An object store's PUT is durable once answered.

        ``private``: the target's folder is this writer's own until it is published
        by a rename (a checkpoint's staging folder): on local disk the file is written
        in place, without a temporary sibling and a rename of its own.
        """
        target = self.path(*parts)
        self._forget_tails(target)
        if self.is_local and private:
            self._call("write", target, lambda: local_files.write_file(target, data, durable))
        elif self.is_local:
            self._call("write", target, lambda: local_files.replace_file(target, data, durable))
        else:
            self._call("write", target, lambda: self.fs.pipe_file(target, data))

    def write_text(self, text: str, *parts: str, durable: bool = False) -> None:
        self.write_bytes(text.encode("utf-8"), *parts, durable=durable)

    def create_bytes(self, data: bytes, *parts: str, durable: bool = False) -> bool:
        """Publish ``data`` only if nothing is at ``parts`` yet; False if something is.

        Of several writers creating one name at the same instant exactly one
        succeeds (local disk: a hard link, which fails on an existing name;
        object stores: :meth:`ObjectWrites.create
        <popflow.infra.storage.object_writes.ObjectWrites.create>`, a conditional PUT).
        ``durable`` as for :meth:`write_bytes`.
        """
        target = self.path(*parts)
        self._forget_tails(target)
        if self.is_local:
            return self._call(
                "create", target, lambda: local_files.create_file(target, data, durable)
            )
        return self._object_writes().create(target, data)

    def create_text(self, text: str, *parts: str, durable: bool = False) -> bool:
        return self.create_bytes(text.encode("utf-8"), *parts, durable=durable)

    def append_text(self, text: str, *parts: str) -> int:
        """Append ``text`` to a derived log and return its new size in bytes.

        Fenced (:mod:`popflow.infra.storage.log_writes`): it lands only on the log this
        Storage object left (or creates it where nothing is), else
        :class:`~popflow.infra.storage.log_writes.LogChanged` and nothing is written. A log
        written before (by an earlier driver) is taken over first with :meth:`adopt_log`.
        Local appends are not retried (a repeated append could duplicate); an object
        store's append is one conditional PUT of the whole new content.
        """
        return self._log_writes().append(self.path(*parts), text.encode("utf-8"))

    def truncate(self, length: int, *parts: str) -> None:
        """Cut a derived log this Storage object wrote back to ``length`` bytes (used to drop
        uncommitted appends); never extends; fenced as :meth:`append_text`."""
        self._log_writes().cut(self.path(*parts), length)

    def adopt_log(self, keep: int, *parts: str, guard: Callable[[], None] = lambda: None) -> None:
        """Take over a derived log, cut back to at most ``keep`` bytes: later appends and
        cuts through this Storage object land on it, and a stalled earlier writer's do not
        (a resume calls it for every log it goes on with, under its new lease). ``guard``
        (the lease check) runs between looking at the log and replacing it, and the log
        is replaced only if it is still the one looked at."""
        self._log_writes().adopt(self.path(*parts), keep, guard)

    def _log_writes(self) -> LogWrites:
        if self._logs is None:
            fs = None if self.is_local else self.fs
            self._logs = LogWrites(self._call, self._url_of, fs, self._conditional_puts)
        return self._logs

    def _object_writes(self) -> ObjectWrites:
        if self._appends is None:
            self._appends = ObjectWrites(
                self._call,
                self._put_object,
                self._read_object,
                lambda path: self.fs.exists(path),
                self._conditional_puts,
                self.url,
            )
        return self._appends

    def _forget_tails(self, path: str) -> None:
        """Drop what this writer knows of the logs at or under ``path`` (it is being
        replaced or removed by a write that is not an append)."""
        if self._logs is not None:
            self._logs.forget(path)

    def put_file(self, local_path: str, *parts: str) -> None:
        """Upload one local file (one PUT on object stores; not atomic on local disk)."""
        dst = self.path(*parts)
        self._forget_tails(dst)

        def put() -> None:
            if self.is_local:
                os.makedirs(os.path.dirname(dst), exist_ok=True)
            self.fs.put_file(local_path, dst, **self._parts())

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

    def rename_new(self, src: tuple[str, ...], dst: tuple[str, ...]) -> None:
        """Move ``src`` to ``dst`` in one step on local disk, only if nothing is at ``dst``
        (``FileExistsError``, nothing moved); local disk only."""
        if not self.is_local:
            raise NotImplementedError("rename_new moves folders on local disk only")
        s, d = self.path(*src), self.path(*dst)
        self._forget_tails(s)
        self._forget_tails(d)
        self._call("rename", s, lambda: local_files.rename_new(s, d), retry=False)

    def exchange(self, a: tuple[str, ...], b: tuple[str, ...]) -> bool:
        """Swap what is at ``a`` and ``b`` in one step (local disk: files or folders);
        False where the filesystem cannot (or on an object store): nothing changed."""
        if not self.is_local:
            return False
        pa, pb = self.path(*a), self.path(*b)
        swap = local_files.exchange
        return bool(self._call("rename", pb, lambda: swap(pa, pb), retry=False))

    def make_folder(self, *parts: str) -> str:
        """Create a folder (local disk; object stores have none) and return its path."""
        p = self.path(*parts)
        if self.is_local:
            self._call("mkdir", p, lambda: os.makedirs(p, exist_ok=True))
        return p

    def remove(self, *parts: str) -> None:
        """Delete a file or a folder tree; missing is fine."""
        p = self.path(*parts)
        self._forget_tails(p)
        with contextlib.suppress(FileNotFoundError):
            self._call("remove", p, lambda: self.fs.rm(p, recursive=True))

    def remove_files(self, names: list[str]) -> None:
        """Delete these files (relative paths; on object stores one batched request per
        1000); missing ones are fine."""
        paths = [self.path(n) for n in names]
        if not paths:
            return
        for p in paths:
            self._forget_tails(p)
        if self.is_local:
            for p in paths:
                with contextlib.suppress(FileNotFoundError):
                    self._call("remove", p, lambda p=p: os.remove(p))
            return
        with contextlib.suppress(FileNotFoundError):
            self._call("remove", paths[0], lambda: self.fs.rm(paths))

    def remove_file(self, *parts: str) -> None:
        """Delete one file (one DELETE on object stores, no listing); missing is fine."""
        p = self.path(*parts)
        self._forget_tails(p)
        with contextlib.suppress(FileNotFoundError):
            self._call("remove", p, lambda: self.fs.rm_file(p))
