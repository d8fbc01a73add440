"""Files written beside a trial on the driver (Ray's ``Trial.local_path``), copied into the
trial's folder on remote storage.

On local storage ``trial.local_path`` is the trial's folder itself and nothing is copied.
On an object store it is a staging folder on the driver
(:func:`~popflow.schedulers.trial.driver_folder`): :class:`Staging` copies each file that
is new or changed since its last copy into the trial's folder, as Ray syncs its driver
staging folder to ``storage_path``. A copy that fails is tried again at the next sync.
Names popflow writes in a trial's folder itself (its logs, ``params.json``,
``error.txt``, checkpoints) are never copied over: a warning says which were left.

The staging folders are the experiment's run on this driver, as Ray's are its session's: a
new experiment starts with them empty (an old run's files under the same name, say one
whose experiment was deleted from the bucket, are never copied into it); a resume goes on
with what a stopped run left there. When the run ends and every file is copied, they are
removed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterable

from popflow.infra.storage.errors import StorageError
from popflow.infra.storage.folder import Storage
from popflow.infra.store.layout import CHECKPOINT_PREFIX, ERROR_FILE, LOG_DIR, LOGS, PARAMS
from popflow.schedulers.trial import Trial, driver_folder

logger = logging.getLogger(__name__)

#: the trial folder's names that are popflow's own (a staged file of that name is left)
_OWN = (*LOGS, PARAMS, ERROR_FILE)


def _is_own(rel: str) -> bool:
    top = rel.split("/", 1)[0]
    return rel in _OWN or top.startswith((CHECKPOINT_PREFIX, LOG_DIR))


class Staging:
    """Copies the trials' staging folders into ``storage`` (the experiment's folder)."""

    def __init__(self, storage: Storage, fresh: bool = False) -> None:
        """``fresh``: a new experiment (not a resume): an old run's staged files are dropped."""
        self.storage = storage
        self._copied: dict[str, tuple[int, int]] = {}  # staged file -> (size, mtime) copied
        self._warned: set[str] = set()
        self._failed: set[str] = set()  # staged files whose last copy failed
        # the experiment's staging folder: the parent of any of its trials'
        self.folder = os.path.dirname(driver_folder(storage.full_url().rstrip("/") + "/_"))
        if fresh and not storage.is_local:
            shutil.rmtree(self.folder, ignore_errors=True)

    def close(self) -> None:
        """The run ended and its files were synced: remove the staging folders, unless a
        copy failed (its file stays for a resume to copy)."""
        if self.storage.is_local:
            return
        if self._failed:
            logger.warning("%s kept: %d files could not be copied", self.folder, len(self._failed))
            return
        shutil.rmtree(self.folder, ignore_errors=True)
        # the storage URL's folder, empty once its last experiment's is gone
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(self.folder))

    def sync(self, trials: Iterable[Trial]) -> None:
        """Copy what changed in each trial's staging folder since the last sync."""
        if self.storage.is_local:
            return  # local_path is the trial's folder: written in place
        root = self.storage.full_url().rstrip("/") + "/"
        for trial in trials:
            if not trial.path.startswith(root):
                continue
            folder = driver_folder(trial.path)
            if os.path.isdir(folder):
                self._sync_folder(folder, trial.path[len(root) :])

    def _sync_folder(self, folder: str, dirname: str) -> None:
        for dirpath, _dirs, names in os.walk(folder):
            for name in sorted(names):
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, folder).replace(os.sep, "/")
                if _is_own(rel):
                    if full not in self._warned:
                        self._warned.add(full)
                        logger.warning(
                            "%s is not copied into the trial's folder: %s/%s is popflow's own",
                            full,
                            dirname,
                            rel,
                        )
                    continue
                st = os.stat(full)
                stamp = (st.st_size, st.st_mtime_ns)
                if self._copied.get(full) == stamp:
                    continue
                try:
                    self.storage.put_file(full, dirname, *rel.split("/"))
                except (StorageError, OSError) as e:  # tried again at the next sync
                    logger.warning("could not copy %s into %s: %s", full, dirname, e)
                    self._failed.add(full)
                    continue
                self._copied[full] = stamp
                self._failed.discard(full)
