"""Local-disk writes, one attempt each (:meth:`Storage._call <popflow.infra.storage.Storage>`
retries and reports): publish by rename, create by hard link, append, cut back."""

from __future__ import annotations

import contextlib
import os
import uuid


def replace_file(target: str, data: bytes, durable: bool) -> None:
    """Write ``data`` to a temporary sibling, then rename it over ``target``.

    On any failure (a full disk included) the temporary file is removed and
    ``target`` keeps its previous content.
    """
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:  # a failed write leaves no temporary file behind
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def create_file(target: str, data: bytes, durable: bool) -> bool:
    """Write ``data`` to a temporary sibling, then hard-link it to ``target`` (atomic,
    and refused if ``target`` exists); False if it does."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        try:
            os.link(tmp, target)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(OSError):
            os.remove(tmp)


def append_file(target: str, data: bytes) -> int:
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "ab") as f:
        f.write(data)
        f.flush()
        return f.tell()


def truncate_file(target: str, length: int) -> None:
    if os.path.getsize(target) > length:  # never extend (as on object stores)
        with open(target, "r+b") as f:
            f.truncate(length)
