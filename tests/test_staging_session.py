"""The driver's staging folders (``trial.local_path`` on remote storage) are the run's: a
new experiment starts with them empty, a resume goes on with them, and they are removed
when the run ends with every file copied (kept while a copy fails)."""

from __future__ import annotations

import os
import tempfile

import pytest

from popflow.flows.events.staging import Staging
from popflow.infra.storage.errors import StorageError
from popflow.schedulers import Trial

pytestmark = pytest.mark.unit

URL = "s3://bucket/prefix/exp"


class _Bucket:
    """The part of ``Storage`` that ``Staging`` uses: copies recorded, or refused."""

    is_local = False

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.refuse = False

    def full_url(self) -> str:
        return URL

    def put_file(self, local: str, *parts: str) -> None:
        if self.refuse:
            raise StorageError("upload", "/".join(parts), "unreachable")
        with open(local, "rb") as f:
            self.files["/".join(parts)] = f.read()


@pytest.fixture(autouse=True)
def staged_here(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


def _write(trial: Trial, text: str) -> None:
    with open(os.path.join(trial.local_path, "log.csv"), "a") as f:
        f.write(text)


def test_a_new_experiment_drops_an_old_runs_files_and_a_resume_keeps_them():
    trial = Trial("t", {}, path=f"{URL}/t_0")
    _write(trial, "old\n")
    bucket = _Bucket()
    Staging(bucket, fresh=False).sync([trial])  # a resume: the file is its experiment's
    assert bucket.files == {"t_0/log.csv": b"old\n"}
    bucket = _Bucket()
    staging = Staging(bucket, fresh=True)  # a new experiment of the same name
    _write(trial, "new\n")
    staging.sync([trial])
    assert bucket.files == {"t_0/log.csv": b"new\n"}


def test_the_folders_are_removed_at_the_end_once_every_file_is_copied():
    trial = Trial("t", {}, path=f"{URL}/t_0")
    bucket = _Bucket()
    staging = Staging(bucket, fresh=True)
    _write(trial, "1\n")
    bucket.refuse = True
    staging.sync([trial])
    staging.close()  # a copy failed: kept for a resume to copy
    assert os.path.isfile(os.path.join(trial.local_path, "log.csv"))
    bucket.refuse = False
    staging.sync([trial])
    staging.close()
    assert bucket.files == {"t_0/log.csv": b"1\n"}
    assert not os.path.exists(staging.folder)
    assert not os.path.exists(os.path.dirname(staging.folder))  # nothing else under it
