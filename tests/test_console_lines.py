"""What the console says, line by line (issue 43, item 9): a resume's clean-up in one line,
no HTTP request lines, one line for a held lease, a short pickle warning."""

from __future__ import annotations

import logging

import pytest

from popflow.flows.experiment.opening import remove_uncommitted
from popflow.flows.experiment.trial_table import TrialRecord
from popflow.infra.storage.folder import Storage
from popflow.schedulers import Trial

pytestmark = pytest.mark.unit


def test_a_resume_says_its_removed_checkpoints_in_one_line(tmp_path, caplog):
    """A killed PBT run's resume printed a line per uncommitted checkpoint (169 of 196
    lines): one INFO line says how many and where; the paths are at DEBUG."""
    records = []
    for i in range(3):
        rec = TrialRecord(trial=Trial(trial_id=f"t{i}", config={"a": i}), index=i, dirname=f"d{i}")
        for it in range(1, 6):
            (tmp_path / rec.dirname / f"checkpoint_{it:06d}").mkdir(parents=True)
        records.append(rec)
    with caplog.at_level(logging.DEBUG, logger="popflow"):
        remove_uncommitted(Storage(str(tmp_path)), records)
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "uncommitted" in r.getMessage()]
    infos = [m for level, m in said if level >= logging.INFO]
    assert infos == [
        f"removed 15 uncommitted checkpoints in {Storage(str(tmp_path)).url} (the paths at DEBUG)"
    ], said
    assert sum(level == logging.DEBUG for level, _ in said) == 15
    assert not any((tmp_path / "d0").iterdir())
