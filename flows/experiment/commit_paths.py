"""The paths a commit names, checked to stay inside the experiment before any use.

A commit's SHA-256 catches damage, not an edit: anyone who can write the
experiment's folder can write a commit whose checksum matches. Resuming and
reading trust a commit's trial table to say where things are (trial folders,
checkpoint names, the checkpoint each trial restores from, the derived logs to
cut back, the checkpoints retired), and act on those paths: they write
``params.json`` and logs into trial folders, and delete checkpoints. So a commit
read to resume or to read from is checked here first, before the lease is taken
or anything is written; anything that is not popflow's own shape of name stops
with :class:`~popflow.infra.storage.safe_paths.UnsafePath`, and nothing is changed.
:meth:`Storage.path <popflow.infra.storage.folder.Storage.path>` refuses paths that leave
the experiment as well, as a second line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from popflow.infra.storage.safe_paths import UnsafePath, is_name
from popflow.infra.store.layout import GLOBAL_POLICY, LOGS, is_checkpoint_name

__all__ = ["UnsafePath", "check_commit_paths"]


def check_commit_paths(commit: Mapping[str, Any], url: str) -> None:
    """Every path ``commit`` (as :meth:`ExperimentLog.read
    <popflow.infra.store.commit_log.ExperimentLog.read>` returns it) names is popflow's
    own shape, inside the experiment at ``url``; else :class:`UnsafePath`.

    Trial ids and folders are single plain names, checkpoint names are
    ``checkpoint_NNNNNN`` (with an optional ``_e<epoch>`` and ``_k``), a ``restore``, lineage ``start`` or
    ``deleted`` entry is ``<a trial's folder>/<a checkpoint name>``, and the derived logs are
    the trials' ``result.json``/``progress.csv`` and ``pbt_global.txt``.
    """
    seq = commit.get("seq")

    def refuse(what: str) -> UnsafePath:
        return UnsafePath(
            f"commit {seq} of {url} {what}, which is not popflow's own and could reach "
            "outside the experiment; nothing was changed (was the commit edited? restore "
            "the folder from a copy you trust)"
        )

    trials = commit.get("trials")
    if not isinstance(trials, list) or not all(isinstance(t, Mapping) for t in trials):
        raise refuse("has no list of trials")
    folders = set()
    for t in trials:
        tid, dirname = t.get("trial_id"), t.get("dirname")
        if not is_name(tid):
            raise refuse(f"names a trial {tid!r}")
        if not is_name(dirname):
            raise refuse(f"gives trial {tid} the folder {dirname!r}")
        folders.add(dirname)
        checkpoints = t.get("checkpoints")
        if not isinstance(checkpoints, list):
            raise refuse(f"gives trial {tid} the checkpoints {checkpoints!r}")
        for c in checkpoints:
            name = c.get("name") if isinstance(c, Mapping) else c
            if not is_checkpoint_name(name):
                raise refuse(f"gives trial {tid} a checkpoint named {name!r}")

    def is_checkpoint_path(path: Any) -> bool:
        if not isinstance(path, str):
            return False
        folder, _, name = path.partition("/")
        return folder in folders and is_checkpoint_name(name)

    for t in trials:
        restore = t.get("restore")
        if restore is not None and not is_checkpoint_path(restore):
            raise refuse(f"has trial {t['trial_id']} restore from {restore!r}")
        start = t.get("start")  # where its lineage began: a fallback restores from it
        if start is not None and not (
            isinstance(start, Mapping) and is_checkpoint_path(start.get("restore"))
        ):
            raise refuse(f"starts trial {t['trial_id']}'s lineage at {start!r}")
        rebuild = t.get("rebuild")  # the state an exploit cloned, made again from there
        if rebuild is not None and not (
            isinstance(rebuild, Mapping)
            and (rebuild.get("restore") is None or is_checkpoint_path(rebuild.get("restore")))
            and rebuild.get("source") in folders
        ):
            raise refuse(f"rebuilds trial {t['trial_id']}'s cloned state from {rebuild!r}")
    logs = {GLOBAL_POLICY} | {f"{d}/{f}" for d in folders for f in LOGS}
    derived = commit.get("derived", {})
    if not isinstance(derived, Mapping):
        raise refuse(f"lists the derived logs {derived!r}")
    for path in derived:
        if path not in logs:
            raise refuse(f"lists a derived log {path!r}")
    deleted = commit.get("deleted", [])
    if not isinstance(deleted, list):
        raise refuse(f"lists the deleted checkpoints {deleted!r}")
    for path in deleted:
        if not is_checkpoint_path(path):
            raise refuse(f"lists a deleted checkpoint {path!r}")
