"""Which storage a deployed flow may read and write, as the deployment's owner allows.

Whoever starts a run of the deployable ``experiment`` flow chooses its ``storage``, and
a resume reads what it finds there: the experiment's log, its trials' checkpoints
(which a trainable then loads). A caller who may point a run at a folder they can
write could plant what the run reads. So, as for trainables
(:mod:`popflow.flows.spec.trainable_paths`), the flow takes only storage under the
roots its owner lists in :data:`ALLOWLIST_ENV`, checked before anything is read.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence

#: The environment variable of the process that runs a deployed ``experiment`` flow:
#: comma-separated storage roots (local folders, URLs such as ``s3://bucket/prefix``),
#: ``*`` for any. The deployment owner sets it; a flow run's parameters cannot.
ALLOWLIST_ENV = "POPFLOW_STORAGE_ALLOWLIST"
#: Unset: the flow's default storage only (``./results`` in the folder the flow runs in).
DEFAULT_ALLOWLIST = ("./results",)


def allowlist() -> tuple[str, ...]:
    """The storage roots a deployed flow may use here (:data:`ALLOWLIST_ENV`)."""
    value = os.environ.get(ALLOWLIST_ENV)
    if value is None or not value.strip():
        return DEFAULT_ALLOWLIST
    return tuple(p.strip() for p in value.split(",") if p.strip())


def _where(url: str) -> tuple[str, str] | None:
    """``url`` as (protocol, absolute path) to compare by whole parts: a local path
    resolved (``..`` and links followed, so a link inside a root that leads out of it
    is out), a URL's path normalised; None for a URL that climbs with ``..``, and for
    a chained one (``simplecache::/elsewhere``: fsspec opens its last part, wherever)."""
    if "::" in url:
        return None
    if url.startswith("file://"):
        url = url[len("file://") :]
    if "://" not in url:
        return "file", os.path.realpath(os.path.expanduser(url))
    protocol, _, path = url.partition("://")
    parts = path.split("/")
    if ".." in parts or "." in parts:  # an object store keeps them as names: refuse
        return None
    return protocol.lower(), posixpath.normpath("/" + path.strip("/"))


def is_allowed(storage: str, roots: Sequence[str]) -> bool:
    """``storage`` is one of ``roots`` or lies under one (by whole folder names:
    ``s3://b/exp`` allows ``s3://b/exp/x``, not ``s3://b/exp2``), or a root is ``*``."""
    if "*" in roots:
        return True
    where = _where(storage)
    if where is None:
        return False
    for root in roots:
        allowed = _where(root)
        if allowed is None or allowed[0] != where[0]:
            continue
        top = allowed[1].rstrip("/") + "/"
        if where[1] == allowed[1] or where[1].startswith(top):
            return True
    return False


def check_storage(storage: object, roots: Sequence[str] | None = None) -> None:
    """ValueError unless ``storage`` (the ``storage`` parameter) lies under ``roots``
    (:func:`allowlist` if None), naming the value and how to allow it."""
    roots = allowlist() if roots is None else roots
    if not isinstance(storage, str) or not storage:
        raise ValueError(f"`storage` is {storage!r}, but must be a folder or a URL")
    if not is_allowed(storage, roots):
        raise ValueError(
            f"`storage` {storage!r} is not among the storage roots this deployment may use "
            f"({', '.join(roots)}); its owner allows more with {ALLOWLIST_ENV} (comma-"
            "separated folders or URL prefixes such as s3://bucket/prefix, * for any) in "
            "the environment of the worker that runs it"
        )
