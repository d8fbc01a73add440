"""Nothing lost: a damaged newest commit, or a full disk, costs at most a round."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.driving import DRIVER, drive, read_experiment

from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import (
    DamagedCommit,
    DamagedLog,
    ExperimentLog,
    decode_commit,
    encode_commit,
)
from popflow.infra.store.layout import commit_path

KEEP_ONE = ["--num-to-keep", "1"]


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "garbage":
        path.write_bytes(os.urandom(len(data)))
    elif how == "empty-json":
        path.write_bytes(b"{}")
    elif how == "edited":  # valid JSON, changed by hand; the checksum line kept
        body, digest = data.decode().rstrip("\n").rsplit("\n", 1)
        path.write_text(body.replace('"TERMINATED"', '"PENDING"') + "\n" + digest + "\n")
    else:
        raise AssertionError(how)


@pytest.mark.unit
@pytest.mark.parametrize("how", ["truncated", "garbage", "empty-json", "edited"])
def test_a_commit_that_fails_its_check_is_damaged(tmp_path, how):
    path = tmp_path / "c.json"
    path.write_bytes(encode_commit({"seq": 1, "state": {"trials": [{"status": "TERMINATED"}]}}))
    assert decode_commit(path.read_bytes())["seq"] == 1
    damage(path, how)
    with pytest.raises(DamagedCommit):
        decode_commit(path.read_bytes())


def files_of(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("ref")
    drive(str(root), "exp", "pbt_synch", extra=KEEP_ONE)
    return read_experiment(str(root / "exp"))


@pytest.fixture(scope="module")
def killed_at_8(prefect_server, tmp_path_factory) -> Path:
    """An experiment whose driver was killed right after commit 8 (one checkpoint kept
    a trial); each test damages a copy of its own."""
    root = tmp_path_factory.mktemp("killed")
    assert drive(str(root), "exp", "pbt_synch", kill_at="commit-after:8", extra=KEEP_ONE) != 0
    return root / "exp"


@pytest.mark.system
@pytest.mark.parametrize("how", ["truncated", "garbage", "empty-json", "edited"])
def test_resume_falls_back_over_a_damaged_newest_commit(
    prefect_server, reference, killed_at_8, tmp_path, how
):
    storage = str(tmp_path)
    shutil.copytree(killed_at_8, tmp_path / "exp")
    log = ExperimentLog(Storage(os.path.join(storage, "exp")))
    newest = log.commit_numbers()[-1]
    assert newest == 8
    damage(tmp_path / "exp" / commit_path(newest), how)
    drive(storage, "exp", "pbt_synch", extra=KEEP_ONE)  # num_to_keep=1: the fallback's
    final = read_experiment(os.path.join(storage, "exp"))  # checkpoints were kept for it
    assert set(final["status"]) == {"TERMINATED"} and final["checkpoints_ok"]
    assert final == reference


@pytest.mark.system
def test_two_damaged_commits_stop_resume_with_a_clear_error_and_delete_nothing(
    prefect_server, killed_at_8, tmp_path
):
    storage = str(tmp_path)
    shutil.copytree(killed_at_8, tmp_path / "exp")
    log = ExperimentLog(Storage(os.path.join(storage, "exp")))
    for seq in log.commit_numbers()[-2:]:
        damage(tmp_path / "exp" / commit_path(seq), "truncated")
    before = files_of(tmp_path / "exp")
    proc = subprocess.run(
        [sys.executable, DRIVER, storage, "exp", "pbt_synch", *KEEP_ONE],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "DamagedLog" in proc.stderr and "are both damaged" in proc.stderr
    assert files_of(tmp_path / "exp") == before
    with pytest.raises(DamagedLog, match="falls back over one damaged commit only"):
        log.latest()


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MB tmpfs of its own, 3 MB of it taken by a filler file."""
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    try:
        (mount / "filler").write_bytes(b"\0" * (3 << 20))
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.system
def test_a_full_disk_stops_the_run_resumable_and_resume_finishes_it(
    prefect_server, small_disk, tmp_path
):
    args = ["--pad-bytes", "100000", *KEEP_ONE]
    storage = str(small_disk / "results")
    proc = subprocess.run(
        [sys.executable, DRIVER, storage, "exp", "pbt_synch", *args],
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )
    assert proc.returncode != 0
    assert "StorageError" in proc.stderr and "No space left on device" in proc.stderr
    log = ExperimentLog(Storage(os.path.join(storage, "exp")))
    state = log.latest()
    assert state is not None
    assert "ERROR" not in {t["status"] for t in state["trials"]}  # not the trials' fault
    assert {t["status"] for t in state["trials"]} & {"PENDING", "PAUSED", "RUNNING"}
    (small_disk / "filler").unlink()  # the cause is fixed
    drive(storage, "exp", "pbt_synch", extra=args)
    drive(str(tmp_path / "ref"), "exp", "pbt_synch", extra=args)
    assert read_experiment(os.path.join(storage, "exp")) == read_experiment(
        str(tmp_path / "ref" / "exp")
    )
