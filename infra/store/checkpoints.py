"""Checkpoint folders on storage, published atomically and verified on load.

A checkpoint is a folder ``<trial>/checkpoint_NNNNNN/`` plus a manifest
(``.popflow_manifest.json``) that lists every file with its size and SHA-256
and carries popflow's metadata (the iteration and result it was taken at).
The manifest is what makes a checkpoint exist: on local disk the whole
folder appears by one rename; on object stores the manifest is written after
every data object. A folder without a manifest, or whose files disagree with
it, is never used. Nor is one that holds a link: a listed file, or a folder on its
way, that is a link (to outside the experiment, or anywhere) is refused wherever a
checkpoint is checked, copied or loaded, since its digest would be taken of, and a
trainable would load, whatever the link points at.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO

from popflow.infra.storage.folder import Storage, StorageError
from popflow.infra.storage.safe_paths import is_relative_file
from popflow.infra.store.layout import (
    MANIFEST,
    checkpoint_owner,
    save_folder,
    staging_path,
)


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupt."""


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """The SHA-256 of a checkpoint's manifest as published: one name for one version of
    a checkpoint (its files' digests and its metadata), which the driver commits so a
    worker can tell its own copy of that version from any other."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class _NotAFile(Exception):
    """A listed checkpoint file is a link, or something other than a regular file."""


def _open_listed(folder: str, rel: str) -> BinaryIO:
    """The checkpoint file ``rel`` under ``folder``, opened for reading without following a
    link, neither at its name nor at a folder on its way (:class:`_NotAFile`), without
    blocking (a FIFO), and only if it is a regular file; FileNotFoundError if it is not
    there. Links above ``folder`` are the storage's to check."""
    parts = rel.split("/")
    path = folder
    for i, part in enumerate(parts[:-1]):
        path = os.path.join(path, part)
        if stat.S_ISLNK(os.lstat(path).st_mode):
            raise _NotAFile(f"its folder {'/'.join(parts[: i + 1])!r} is a link")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(os.path.join(path, parts[-1]), flags)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK):  # O_NOFOLLOW refused a link
            raise _NotAFile("it is a link") from None
        if e.errno in (errno.ENOTDIR, errno.ENXIO):
            raise _NotAFile("it is no regular file") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise _NotAFile("it is no regular file")
    return os.fdopen(fd, "rb")


def _listed(url: str, folder: str, rel: str) -> BinaryIO:
    """:func:`_open_listed`, its refusals as :class:`CheckpointError` naming the file
    (``url``: the checkpoint's, for messages)."""
    try:
        return _open_listed(folder, rel)
    except _NotAFile as e:
        raise CheckpointError(
            f"checkpoint {url} file {rel!r} is refused: {e}; popflow follows no link in a "
            "checkpoint, so nothing of it is loaded"
        ) from None
    except (FileNotFoundError, NotADirectoryError):
        raise CheckpointError(f"checkpoint {url} is missing file {rel!r}") from None


class DigestingWriter:
    """A binary file's ``write`` that also takes the file's manifest entry (its size and
    SHA-256) on the way, so publishing it need not open and read it again
    (:func:`publish_checkpoint`'s ``known``)."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self._sha = hashlib.sha256()
        self._size = 0

    def write(self, data: Any) -> int:  # pickle also hands over memoryviews of large buffers
        self._sha.update(data)
        self._size += memoryview(data).nbytes
        return self._file.write(data)

    def entry(self) -> dict[str, Any]:
        return {"size": self._size, "sha256": self._sha.hexdigest()}


def _local_files(
    local_dir: str, known: Mapping[str, dict[str, Any]] | None = None
) -> dict[str, dict[str, Any]]:
    files: dict[str, dict[str, Any]] = {}
    for dirpath, _dirs, names in os.walk(local_dir):
        for name in names:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, local_dir).replace(os.sep, "/")
            if rel == MANIFEST:
                continue
            size = os.path.getsize(full)
            entry = known.get(rel) if known else None
            if entry is None or entry["size"] != size:  # not ours, or written over since
                entry = {"size": size, "sha256": _digest(full)}
            files[rel] = entry
    return files


def staging_folder(storage: Storage, trial_dir: str) -> str | None:
    """On local disk, a new folder beside the trial's checkpoints, relative to the storage
    (a ``.tmp-`` name, which nothing reads and a resume removes), for a checkpoint to be
    saved into and published by a rename (:func:`publish_checkpoint`'s ``staged``): no
    copy, no temporary folder elsewhere. None on object stores."""
    if not storage.is_local:
        return None
    folder = save_folder(trial_dir)
    storage.make_folder(folder)
    return folder


def publish_checkpoint(
    storage: Storage,
    local_dir: str,
    rel_path: str,
    metadata: dict[str, Any],
    fence: Callable[[], None] | None = None,
    staged: str | None = None,
    known: Mapping[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Upload ``local_dir`` to ``rel_path`` and make it visible atomically, only if no
    checkpoint is published there yet: a published checkpoint is never replaced.

    ``fence`` runs just before the checkpoint becomes visible (and on object stores
    before any data object is uploaded); it raises to stop a publish of a driver that
    another has taken over (:func:`popflow.infra.store.lease.fence`).
    ``staged``: ``local_dir`` is this :func:`staging_folder` of the storage, moved into
    place (and removed if the publish fails) rather than copied. ``known``: manifest
    entries of files popflow wrote there itself (:class:`DigestingWriter`), by path
    relative to ``local_dir``; every other file is read to take its digest.

    Create-only: a publish onto a name that holds a checkpoint raises
    :class:`CheckpointExists` and changes nothing there (local disk: the staged folder is
    renamed to a name that must not exist; object stores: the manifest is looked for
    before any upload and PUT last with ``If-None-Match: *``). Each writer has names of its
    own: the name's owner epoch (:func:`~popflow.infra.store.layout.checkpoint_owner`) must
    be ``metadata["epoch"]``, the publisher's, where it has one (else ``ValueError``,
    nothing written), and within an epoch a re-dispatched segment publishes under its own
    attempt's names (:func:`~popflow.infra.store.layout.checkpoint_name`): a stale writer,
    however it stalls, never changes what a current driver committed.
    """
    _check_owner(storage, rel_path, metadata.get("epoch"))
    if not os.path.isdir(local_dir):  # os.walk would see an empty checkpoint and publish it
        raise CheckpointError(
            f"cannot publish checkpoint {storage.full_url(rel_path)}: {local_dir!r} is not a folder"
        )
    manifest = {"files": _local_files(local_dir, known), "metadata": metadata}
    manifest_bytes = json.dumps(manifest, sort_keys=True).encode()
    if storage.is_local:
        tmp = staged or staging_path(rel_path)
        try:
            if not staged:
                storage.put_dir(local_dir, tmp)
            storage.write_bytes(manifest_bytes, tmp, MANIFEST, private=True)  # tmp is ours
            if fence is not None:
                fence()
            storage.rename_new((tmp,), (rel_path,))
        except StorageError as e:
            storage.remove(tmp)  # leave no half-copied folder behind
            if e.errno == errno.EEXIST:
                raise _exists(storage, rel_path) from None
            raise
        except BaseException:
            storage.remove(tmp)
            raise
    else:
        # object stores: a checkpoint exists once its manifest does. One that is there is
        # left alone (no upload over its data objects); the manifest is PUT last, created
        # only where none is (If-None-Match), so of two publishes of one name one wins
        if fence is not None:
            fence()
        if storage.file_exists(rel_path, MANIFEST):
            raise _exists(storage, rel_path)
        storage.put_dir(local_dir, rel_path)
        if fence is not None:
            fence()
        if not storage.create_bytes(manifest_bytes, rel_path, MANIFEST):
            raise _exists(storage, rel_path)
    return manifest


class CheckpointExists(CheckpointError):
    """A publish found a checkpoint already published under its name (never replaced)."""


def _exists(storage: Storage, rel_path: str) -> CheckpointExists:
    return CheckpointExists(
        f"checkpoint {storage.full_url(rel_path)} is published already; a published "
        "checkpoint is never replaced, so this publish changed nothing (a re-dispatched "
        "segment publishes under its own attempt's names: "
        "popflow.infra.store.layout.checkpoint_name)"
    )


def _check_owner(storage: Storage, rel_path: str, epoch: Any) -> None:
    """``ValueError`` unless a publisher of lease ``epoch`` owns the name ``rel_path`` ends
    in (a checkpoint name that carries another epoch, or a plain one above epoch 1)."""
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1:
        return  # no lease: nothing fences this publish
    owner = checkpoint_owner(rel_path.rsplit("/", 1)[-1])
    if owner is not None and owner != epoch:
        raise ValueError(
            f"checkpoint {storage.full_url(rel_path)} is driver epoch {owner}'s name; a "
            f"segment of driver epoch {epoch} publishes only under its own "
            "(popflow.infra.store.layout.checkpoint_name)"
        )


def read_manifest(storage: Storage, rel_path: str) -> dict[str, Any]:
    try:
        manifest = json.loads(storage.read_bytes(rel_path, MANIFEST))
    except FileNotFoundError:
        raise CheckpointError(
            f"checkpoint {storage.full_url(rel_path)} has no manifest: it was never "
            "published completely"
        ) from None
    except ValueError as e:
        raise CheckpointError(
            f"checkpoint manifest at {storage.full_url(rel_path)} is corrupt: {e}"
        ) from None
    if not (
        isinstance(manifest, dict)
        and isinstance(manifest.get("files"), dict)
        and isinstance(manifest.get("metadata"), dict)
    ):
        raise CheckpointError(
            f"checkpoint manifest at {storage.full_url(rel_path)} is corrupt: "
            "it lacks the 'files' or 'metadata' mapping"
        )
    # its names become local paths (a download, a check): none may leave the folder
    unsafe = [rel for rel in manifest["files"] if not is_relative_file(rel)]
    if unsafe:
        raise CheckpointError(
            f"checkpoint manifest at {storage.full_url(rel_path)} names files outside the "
            f"checkpoint: {unsafe[:3]!r}; nothing was read"
        )
    return manifest


def check_version(
    storage: Storage, rel_path: str, manifest: Mapping[str, Any], digest: Any
) -> None:
    """:class:`CheckpointError` unless ``manifest`` is version ``digest`` of the checkpoint
    (the :func:`manifest_digest` its commit recorded; None: the commit recorded none, as
    commits of earlier releases): what is stored under a committed name is never loaded
    unless it is the version committed."""
    if digest is not None and manifest_digest(manifest) != digest:
        raise CheckpointError(
            f"checkpoint {storage.full_url(rel_path)} is not the version its commit names: "
            "its manifest's digest differs from the committed one, so nothing of it is loaded"
        )


def fetch_checkpoint(
    storage: Storage, rel_path: str, local_dir: str, digest: str | None = None
) -> dict[str, Any]:
    """Download a published checkpoint into ``local_dir``, verify it, return its metadata
    (``digest``: the version committed, :func:`check_version`)."""
    manifest = read_manifest(storage, rel_path)
    check_version(storage, rel_path, manifest, digest)
    os.makedirs(local_dir, exist_ok=True)
    source = storage.path(rel_path) if storage.is_local else None
    for rel, expected in manifest["files"].items():
        dst = os.path.join(local_dir, *rel.split("/"))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if source is not None:  # a copy would follow a link the storage's check lets by
            _listed(storage.full_url(rel_path), source, rel).close()
        try:
            storage.get_file(dst, rel_path, rel)
        except FileNotFoundError:
            raise CheckpointError(
                f"checkpoint {storage.full_url(rel_path)} is missing file {rel!r}"
            ) from None
        _check(storage, rel_path, rel, dst, expected)
    return manifest["metadata"]


def verify_in_place(
    storage: Storage, rel_path: str, digest: str | None = None
) -> tuple[str, dict[str, Any]]:
    """A local checkpoint verified where it is (no copy): its folder and its metadata. The
    folder must hold exactly the files its manifest lists (see :func:`check_folder`), and
    be the version ``digest`` where given (:func:`check_version`)."""
    manifest = read_manifest(storage, rel_path)
    check_version(storage, rel_path, manifest, digest)
    folder = storage.path(rel_path)
    # a trial or checkpoint folder that is a link inside the experiment (which the
    # storage lets by) would hand the trainable another checkpoint than the one named
    if os.path.realpath(folder) != os.path.join(
        os.path.realpath(storage.root), *rel_path.split("/")
    ):
        raise CheckpointError(
            f"checkpoint {storage.full_url(rel_path)} is refused: its folder is a link or "
            "goes through one; popflow follows no link in a checkpoint, so nothing of it is "
            "loaded"
        )
    check_folder(storage, rel_path, folder, manifest)
    return folder, manifest["metadata"]


def check_folder(storage: Storage, rel_path: str, folder: str, manifest: dict[str, Any]) -> None:
    """``folder`` holds exactly the files of the checkpoint at ``rel_path`` that
    ``manifest`` lists (besides the manifest itself), each of its size and SHA-256 (else
    :class:`CheckpointError`). A file the manifest does not list is refused, not
    ignored: a trainable loads its checkpoint from this folder, and a planted
    ``_dict_checkpoint.pkl`` would be unpickled (code run) if it were there."""
    if os.path.islink(folder):  # os.walk and the trainable would follow it
        raise CheckpointError(
            f"checkpoint {storage.full_url(rel_path)} is refused: its folder is a link; "
            "popflow follows no link in a checkpoint, so nothing of it is loaded"
        )
    unlisted = sorted(set(_files_in(folder)) - set(manifest["files"]) - {MANIFEST})
    if unlisted:
        raise CheckpointError(
            f"checkpoint {storage.full_url(rel_path)} holds files its manifest does not "
            f"list: {unlisted[:3]!r}; nothing of it is loaded"
        )
    for rel, expected in manifest["files"].items():
        path = os.path.join(folder, *rel.split("/"))
        _check(storage, rel_path, rel, path, expected, folder)


def copy_listed(source: str, target: str, manifest: dict[str, Any]) -> None:
    """Copy the files ``manifest`` lists (and nothing else) from ``source`` to ``target``;
    :class:`CheckpointError` for one that is a link or no regular file (never followed)."""
    for rel in manifest["files"]:
        dst = os.path.join(target, *rel.split("/"))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with _listed(source, source, rel) as src, open(dst, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)


def _files_in(folder: str) -> Iterator[str]:
    """Every entry under ``folder`` that is not a folder (files, links, anything else), as
    a path relative to it with '/' between parts; a link to a folder counts as a file."""
    for dirpath, dirs, names in os.walk(folder):  # never follows links into folders
        for name in names + [d for d in dirs if os.path.islink(os.path.join(dirpath, d))]:
            yield os.path.relpath(os.path.join(dirpath, name), folder).replace(os.sep, "/")


def _check(
    storage: Storage,
    rel_path: str,
    rel: str,
    path: str,
    expected: dict[str, Any],
    folder: str | None = None,
) -> None:
    """``path`` (the file ``rel`` of ``folder``, if given: then opened as
    :func:`_open_listed` does, refusing links) has the size and SHA-256 ``expected``."""
    url = storage.full_url(rel_path)
    with open(path, "rb") if folder is None else _listed(url, folder, rel) as f:
        size = os.fstat(f.fileno()).st_size
        if size != expected["size"]:
            raise CheckpointError(
                f"checkpoint {storage.full_url(rel_path)} file {rel!r} fails its check: "
                f"size {size}, expected {expected['size']}"
            )
        h = hashlib.sha256()
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    if h.hexdigest() != expected["sha256"]:
        raise CheckpointError(
            f"checkpoint {storage.full_url(rel_path)} file {rel!r} fails its check: "
            "SHA-256 differs from the manifest"
        )
