"""An experiment's ``name``: the folder ``<storage>/<name>`` it lives in.

A name is checked before anything starts or is written (:func:`check_name`,
:func:`check_experiment_path`); a template (``name="pbt-{date}"``) is filled in
first (:func:`expand_name`). The rules keep a name a plain relative path that
reads the same on every store and in every listing: Ray accepts any string,
but a newline or a bidi control splits or reverses a name in a console or log
line, a part longer than a folder name may be fails on disk only after the run
started, and a trailing '.' or space is dropped by some filesystems (Windows,
SMB), so two names would share a folder.
"""

from __future__ import annotations

import time
import unicodedata
from typing import Any

from popflow.infra.storage.folder import Storage

#: Bytes one part of ``name`` may have: a folder name on local disk holds 255
#: (NAME_MAX), less room for the ``_2``, ``_3``, ... a run under a taken name appends.
MAX_NAME_PART_BYTES = 240
#: Bytes left under the experiment's folder for the trial folders and checkpoints
#: in it, of the longest path (local disk: PATH_MAX) or object key (S3: 1024 bytes).
ROOM_INSIDE_BYTES = 512
LOCAL_PATH_BYTES = 4096
OBJECT_KEY_BYTES = 1024

#: Unicode categories a name may not hold: control characters (newline, tab, NUL, ...),
#: invisible formatting ones (bidi overrides that show a name reversed, zero-width
#: spaces), line/paragraph separators and lone surrogates (no UTF-8 for them).
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def _name_error(name: str, rule: str) -> ValueError:
    return ValueError(f"`name` is {name!r}, but {rule}")


def check_name(name: Any) -> None:
    """An experiment name is a relative path inside the storage: no ``..``, no absolute
    path, no empty part (``a//b``), no URL; each part a plain folder name that reads the
    same on every store (no control or invisible characters, not starting with '.', no
    space or '.' at either end, at most :data:`MAX_NAME_PART_BYTES` bytes in UTF-8)."""
    if not isinstance(name, str):
        raise TypeError(f"`name` is {name!r}, but must be a string")
    parts = name.split("/")
    if (
        not name.strip()
        or name.startswith(("/", "~"))
        or "\\" in name
        or "://" in name
        or any(p in ("", ".", "..") for p in parts)
    ):
        raise _name_error(
            name,
            "must be a folder name inside `storage` (parts separated by '/', none empty, "
            "'.' or '..', not absolute)",
        )
    bad = next((c for c in name if unicodedata.category(c) in _REFUSED_CATEGORIES), None)
    if bad is not None:
        raise _name_error(
            name,
            "must not hold control or invisible formatting characters (it has "
            f"{f'U+{ord(bad):04X} {unicodedata.name(bad, str())}'.strip()} at index "
            f"{name.index(bad)})",
        )
    for part in parts:
        rule = _part_rule(part)
        if rule:
            raise _name_error(name, f"its part {part[:40]!r} {rule}")


def _part_rule(part: str) -> str:
    """The rule one part of a name breaks ("" if none)."""
    if part.startswith("."):
        return "must not start with '.' (popflow keeps its own files in such folders)"
    if part != part.strip():
        return "must not begin or end with a space (some filesystems drop trailing ones)"
    if part.endswith("."):
        return "must not end with '.' (Windows and SMB drop it: 'a.' and 'a' would be one folder)"
    size = len(part.encode("utf-8"))
    if size > MAX_NAME_PART_BYTES:
        return (
            f"is {size} bytes in UTF-8, but a part may have at most {MAX_NAME_PART_BYTES} (a "
            "folder name on disk holds 255, less room for the '_2' a second run under the "
            "name gets)"
        )
    return ""


def check_experiment_path(storage: Storage, name: str) -> None:
    """The experiment's folder ``<storage>/<name>`` leaves :data:`ROOM_INSIDE_BYTES` for
    what goes in it, within a local path's or an object key's length."""
    path = storage.path(name)
    if storage.is_local:
        what, limit = "a local path", LOCAL_PATH_BYTES
    else:  # an object's key: the path less its bucket
        what, limit = "an object key", OBJECT_KEY_BYTES
        path = path.split("/", 1)[-1]
    size = len(path.encode("utf-8"))
    if size > limit - ROOM_INSIDE_BYTES:
        raise _name_error(
            name,
            f"in `storage` {storage.url!r} the experiment's folder would be {what} of "
            f"{size} bytes, but may have at most {limit - ROOM_INSIDE_BYTES} ({what} holds "
            f"{limit}, and {ROOM_INSIDE_BYTES} are kept for the trial folders and checkpoints "
            "in it): choose a shorter `name` or `storage`",
        )


#: What a ``name`` template may hold (``name="pbt-{date}"``): a fresh experiment per day
#: or per flow run, for scheduled re-tuning.
NAME_FIELDS = ("date", "time", "flow_run_name", "flow_run_id")


def expand_name(name: str) -> str:
    """``name`` with its ``{date}`` (UTC, YYYY-MM-DD), ``{time}`` (HH-MM-SS),
    ``{flow_run_name}`` and ``{flow_run_id}`` (of the Prefect flow run calling
    ``run``) filled in; a name without braces is returned as it is."""
    if "{" not in name:
        return name
    fields = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "time": time.strftime("%H-%M-%S", time.gmtime()),
    }
    if "{flow_run" in name:
        from prefect.runtime import flow_run

        if flow_run.id is None:
            raise ValueError(
                f"`name` is {name!r}, but {{flow_run_name}}/{{flow_run_id}} need a Prefect "
                "flow run: call run() inside a flow, or use {date}/{time}"
            )
        fields.update(flow_run_name=flow_run.name, flow_run_id=str(flow_run.id))
    try:
        expanded = name.format(**fields)
    except (KeyError, IndexError, ValueError) as e:
        raise ValueError(
            f"`name` is {name!r}, but a name template may only use "
            f"{', '.join('{' + f + '}' for f in NAME_FIELDS)} ({e})"
        ) from None
    check_name(expanded)
    return expanded
