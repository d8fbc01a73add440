"""What the console says, line by line (issue 43, item 9): a resume's clean-up in one line,
no HTTP request lines, one line for a held lease, a short pickle warning."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

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


class _Saved(Exception):
    """The example's arguments are saved: its run goes no further."""


def test_the_pbt_example_run_as_a_script_keeps_its_arguments_as_json(tmp_path, monkeypatch, caplog):
    """``make demo``'s first line was a long warning that the example's trainable and its
    ``lr`` mutation (a lambda) were kept as a pickle: run as a script, the example's
    arguments are all JSON now, and nothing is said."""
    import runpy

    import popflow
    from popflow.flows.spec.run_args import PICKLED_ARGS_FILE, save_run_args

    storage = Storage(str(tmp_path / "exp"))
    keep = ("scheduler", "metric", "mode", "num_samples", "stop", "checkpoint_config", "name")

    def saved(trainable, param_space=None, **kwargs):
        args = {k: v for k, v in kwargs.items() if k in keep}
        save_run_args(storage, {"trainable": trainable, "param_space": param_space, **args})
        raise _Saved

    root = Path(__file__).resolve().parents[1]
    monkeypatch.setattr(popflow, "run", saved)
    monkeypatch.syspath_prepend(str(root / "examples"))  # as python does for a script
    monkeypatch.setattr(sys, "argv", ["pbt_benchmark.py", "--smoke-test"])
    monkeypatch.delitem(sys.modules, "pbt_benchmark", raising=False)
    with caplog.at_level(logging.INFO, logger="popflow"), pytest.raises(_Saved):
        runpy.run_path(str(root / "examples" / "pbt_benchmark.py"), run_name="__main__")
    assert not storage.file_exists(PICKLED_ARGS_FILE)
    assert not [r.getMessage() for r in caplog.records if "pickle" in r.getMessage()]


def test_what_is_pickled_is_said_in_one_short_line(tmp_path, caplog):
    """The warning was 4 lines' worth on an 80-column console; the details are in the docs
    it points to."""
    from popflow.flows.spec.run_args import save_run_args

    with caplog.at_level(logging.INFO, logger="popflow"):
        save_run_args(Storage(str(tmp_path)), {"trainable": "x", "stop": lambda t, r: False})
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith("stop kept as a pickle: ") and len(said) <= 120, said
    assert "docs/how-to/s3-credentials.md" in said
