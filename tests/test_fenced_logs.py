"""The derived logs are fenced in the data: a write lands only on the log its writer left.

A driver stopped right after its lease check, inside an append, used to wake after a
newer driver took over and write on top of the newer driver's log (every trial's
``result.json`` read iterations ``1..8, 1..8`` on S3, ``[1..8, 1, 2]`` on local disk).
These tests drive two writers of one folder by hand, on local disk; the S3 cases are in
``tests/test_s3.py`` (moto's server) and the whole-process case (SIGSTOP inside the
append) in ``tests/test_stale_appends.py``.
"""

from __future__ import annotations

import os

import pytest

import popflow.infra.storage.local_files as local_files
from popflow.flows.experiment.trial_logs import TrialLogs
from popflow.infra.storage.folder import LogChanged, Storage, UnsafePath
from popflow.infra.store.lease import LeaseLost

pytestmark = pytest.mark.unit


def test_an_append_to_a_log_a_newer_writer_adopted_writes_nothing(tmp_path):
    old, new = Storage(str(tmp_path)), Storage(str(tmp_path))
    old.append_text("1\n2\n", "t", "result.json")
    old.append_text("3 (not committed)\n", "t", "result.json")
    new.adopt_log(len(b"1\n2\n"), "t", "result.json")  # a resume: cut back to the commit
    new.append_text("3\n", "t", "result.json")
    with pytest.raises(LogChanged, match="another driver replaced or wrote it"):
        old.append_text("4\n", "t", "result.json")
    with pytest.raises(LogChanged):
        old.truncate(0, "t", "result.json")
    new.append_text("4\n", "t", "result.json")
    assert (tmp_path / "t" / "result.json").read_text() == "1\n2\n3\n4\n"


def test_a_writer_stalled_inside_its_append_writes_where_no_one_reads(tmp_path, monkeypatch):
    """The break itself: the old writer has passed every check and holds the log open;
    a newer writer adopts the log and appends; the old writer's bytes then land in the
    file the adoption replaced, which no one reads."""
    old, new = Storage(str(tmp_path)), Storage(str(tmp_path))
    old.append_text("1\n", "t", "result.json")
    original = local_files.write_all
    stalled = []

    def stall_once(fd: int, data: bytes) -> None:
        if not stalled:  # the old driver stops here; the new one takes over meanwhile
            stalled.append(True)
            new.adopt_log(len(b"1\n"), "t", "result.json")
            new.append_text("2\n", "t", "result.json")
        original(fd, data)

    monkeypatch.setattr(local_files, "write_all", stall_once)
    old.append_text("2 (stale)\n", "t", "result.json")  # it cannot tell: it wrote
    monkeypatch.setattr(local_files, "write_all", original)
    assert (tmp_path / "t" / "result.json").read_text() == "1\n2\n"
    with pytest.raises(LogChanged):  # and its next write is refused
        old.append_text("3\n", "t", "result.json")
    assert sorted(os.listdir(tmp_path / "t")) == ["result.json"]  # no temporary left


def test_a_log_this_writer_did_not_write_or_adopt_is_refused(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "result.json").write_text("someone else's\n")
    s = Storage(str(tmp_path))
    with pytest.raises(LogChanged, match="did not write it"):
        s.append_text("mine\n", "t", "result.json")
    with pytest.raises(LogChanged, match="did not write it"):
        s.truncate(0, "t", "result.json")
    assert (tmp_path / "t" / "result.json").read_text() == "someone else's\n"
    s.truncate(0, "t", "missing.json")  # a log that is not there and never was: fine


def test_a_log_removed_under_its_writer_is_not_recreated(tmp_path):
    s = Storage(str(tmp_path))
    s.append_text("1\n", "t", "result.json")
    os.remove(tmp_path / "t" / "result.json")
    with pytest.raises(LogChanged, match="removed"):
        s.append_text("2\n", "t", "result.json")
    assert not (tmp_path / "t" / "result.json").exists()


def test_a_link_at_a_logs_name_is_never_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("x" * 4200)
    exp = tmp_path / "exp"
    (exp / "t").mkdir(parents=True)
    os.symlink(victim, exp / "t" / "progress.csv")
    s = Storage(str(exp))
    with pytest.raises(UnsafePath, match="link"):
        s.adopt_log(1014, "t", "progress.csv")  # a resume cutting it back
    with pytest.raises(UnsafePath, match="link"):
        s.append_text("a,b\n", "t", "progress.csv")
    assert victim.read_text() == "x" * 4200
    inside = exp / "t" / "kept.csv"  # a link that stays inside: still never written through
    inside.write_text("kept\n")
    os.symlink(inside, exp / "t" / "result.json")
    with pytest.raises(UnsafePath, match="link"):
        s.adopt_log(0, "t", "result.json")
    with pytest.raises(LogChanged):
        s.append_text("{}\n", "t", "result.json")
    assert inside.read_text() == "kept\n"


def test_a_link_swapped_in_after_the_writer_owned_the_log_is_refused(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("victim\n")
    s = Storage(str(tmp_path / "exp"))
    s.append_text("1\n", "t", "result.json")
    path = tmp_path / "exp" / "t" / "result.json"
    os.remove(path)
    os.symlink(victim, path)
    with pytest.raises(UnsafePath, match="link"):  # out of the folder: refused as a path
        s.append_text("2\n", "t", "result.json")
    inside = tmp_path / "exp" / "t" / "other.json"
    inside.write_text("other\n")
    os.remove(path)
    os.symlink(inside, path)  # inside the folder: refused as not the writer's file
    with pytest.raises(LogChanged, match="link"):
        s.append_text("2\n", "t", "result.json")
    assert victim.read_text() == "victim\n" and inside.read_text() == "other\n"


def test_the_log_writer_stops_with_lease_lost_when_a_newer_driver_changed_its_log(tmp_path):
    old, new = Storage(str(tmp_path)), Storage(str(tmp_path))
    lost = []

    def lease_check() -> None:
        if lost:
            raise LeaseLost("this driver (epoch 1) lost the lease")

    logs = TrialLogs(old, 0.0, lease_check=lease_check)
    logs._append("1\n", "t", "result.json")
    new.adopt_log(2, "t", "result.json")
    new.append_text("2\n", "t", "result.json")
    lost.append(True)
    logs._write([(logs._append, ("2 (stale)\n", "t", "result.json"))], 1)
    with pytest.raises(LeaseLost):
        logs._raise_failure()
    lost.clear()  # the lease still held: the change is reported as it is
    logs2 = TrialLogs(old, 0.0, lease_check=lease_check)
    logs2._write([(logs2._append, ("3\n", "t", "result.json"))], 1)
    with pytest.raises(LogChanged):
        logs2._raise_failure()
    logs.close()
    logs2.close()
    assert (tmp_path / "t" / "result.json").read_text() == "1\n2\n"


def test_a_resume_stalled_inside_its_adoption_changes_nothing_when_it_wakes(tmp_path):
    """A resumer looked at a log and checked its lease, then stopped; a newer driver took
    over, adopted the log and appended. The stale resumer's adoption, a rename of its cut
    copy over the log, once truncated the newer driver's lines (and with the commits
    that held them pruned, no resume could go on)."""
    old, new = Storage(str(tmp_path)), Storage(str(tmp_path))
    first = Storage(str(tmp_path))
    first.append_text("1\n2\n", "t", "result.json")

    def stall_then_newer_driver_runs() -> None:  # the stale resumer's lease check passed
        new.adopt_log(4, "t", "result.json")
        new.append_text("3\n", "t", "result.json")

    with pytest.raises(LogChanged, match="adopted or replaced it"):
        old.adopt_log(2, "t", "result.json", guard=stall_then_newer_driver_runs)
    assert (tmp_path / "t" / "result.json").read_text() == "1\n2\n3\n"
    new.append_text("4\n", "t", "result.json")  # the newer driver goes on
    assert (tmp_path / "t" / "result.json").read_text() == "1\n2\n3\n4\n"
    assert sorted(os.listdir(tmp_path / "t")) == ["result.json"]


def test_an_adoption_whose_lease_check_fails_changes_nothing(tmp_path):
    s = Storage(str(tmp_path))
    s.append_text("1\n2\n", "t", "result.json")

    def lost() -> None:
        raise LeaseLost("a newer driver holds it")

    with pytest.raises(LeaseLost):
        Storage(str(tmp_path)).adopt_log(0, "t", "result.json", guard=lost)
    assert (tmp_path / "t" / "result.json").read_text() == "1\n2\n"
    s.append_text("3\n", "t", "result.json")  # still its writer's file
