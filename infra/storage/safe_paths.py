"""Paths stay inside the folder they belong to: the rule, and the error that says so.

popflow derives paths from what it reads back from storage (trial folders and
checkpoint names in a commit, a checkpoint's manifest, the files of
``with_parameters``). Storage is shared, and a commit is only checksummed, not
signed: an edited one must not make popflow write or delete outside the
experiment. :class:`~popflow.infra.storage.folder.Storage` refuses any path that leaves
its root, and the readers of stored state check each name first
(:mod:`popflow.flows.experiment.commit_paths`), so a violation stops before anything is
changed.
"""

from __future__ import annotations

import os
import posixpath
import stat
from typing import Any

__all__ = ["UnsafePath", "escapes", "is_name", "is_relative_file", "leads_out"]


class UnsafePath(ValueError):
    """A path (given, or read from storage) would leave the folder it must stay in.

    A ``ValueError``: like a bad argument, it is refused before anything is
    written, and trying again cannot help (a deployed flow does not retry it).
    """


def is_name(part: Any) -> bool:
    """``part`` is one plain folder or file name: a non-empty string without ``/``,
    ``\\`` or NUL that does not start with ``.`` (so not ``.``, ``..`` nor hidden)."""
    return (
        isinstance(part, str)
        and part != ""
        and not part.startswith(".")
        and not any(c in part for c in "/\\\0")
    )


def is_relative_file(path: Any) -> bool:
    """``path`` is a relative ``/``-separated path of plain parts (no ``..``, no ``.``,
    no empty part, not absolute); hidden names are allowed below the top."""
    if not isinstance(path, str) or not path or "\\" in path or "\0" in path:
        return False
    return all(p not in ("", ".", "..") for p in path.split("/"))


def escapes(root: str, path: str) -> bool:
    """``path`` (``/``-separated, beginning with ``root``) leaves ``root`` once ``..`` parts
    are resolved."""
    base = posixpath.normpath(root)
    resolved = posixpath.normpath(path)
    if resolved == base:
        return False
    return not resolved.startswith(base.rstrip("/") + "/")


def leads_out(root: str, parts: tuple[str, ...]) -> str | None:
    """Where ``parts`` below the local folder ``root`` really lead, if a link below
    ``root`` takes them out of it; None if they stay inside. Links above ``root`` (the
    root itself a link) are the user's to make. One ``lstat`` a part, and the path is
    resolved only where a part is a link: this runs on every local storage call."""
    path = root
    for part in "/".join(parts).split("/"):
        if part in ("", "."):
            continue
        path = os.path.join(path, part)
        try:
            if stat.S_ISLNK(os.lstat(path).st_mode):
                break
        except (FileNotFoundError, NotADirectoryError):
            return None  # nothing further down exists to be a link
    else:
        return None
    base = os.path.realpath(root)
    real = os.path.realpath(os.path.join(root, *parts))
    inside = real == base or real.startswith(base.rstrip(os.sep) + os.sep)
    return None if inside else real
