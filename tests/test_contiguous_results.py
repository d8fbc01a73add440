"""A trial's logged iterations stay 1, 2, 3, ...: a trial sent back to an earlier state
(a retry, a lost worker, a damaged checkpoint) supersedes what it logged after that
state, and never goes on from a trainable that trained past a refused result."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from trainables import Misbehaving, ParityTrainable, forgetful_function

from popflow import ASHAScheduler, CheckpointConfig, FIFOScheduler, run
from popflow.flows.experiment.trial_logs import TrialLogs, csv_prefix_size
from popflow.flows.experiment.trial_table import TrialRecord
from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import ExperimentLog
from popflow.infra.store.layout import DICT_CHECKPOINT_FILE
from popflow.schedulers import Trial


def iterations(result) -> list[int]:
    with open(os.path.join(result.path, "result.json")) as f:
        return [json.loads(line)["training_iteration"] for line in f]


def csv_iterations(result) -> list[int]:
    import pandas as pd

    return list(pd.read_csv(os.path.join(result.path, "progress.csv"))["training_iteration"])


@pytest.mark.integration
def test_a_retry_after_a_refused_result_restores_the_checkpoint(tune_env, tmp_path: Path):
    """The issue's case: a metric that is no number at iteration 3, max_failures=1. The
    trainable had trained on to iteration 4 on its worker; the retry used to go on from
    there, and result.json read [1, 2, 5, 6]."""
    results = run(
        Misbehaving,
        {"a": 1, "how": "string", "at": 3, "once": str(tmp_path / "once")},
        scheduler=FIFOScheduler(),
        metric="mean_accuracy",
        mode="max",
        stop={"training_iteration": 6},
        checkpoint_config=CheckpointConfig(checkpoint_frequency=2),
        max_failures=1,
        name="refused-once",
        seed=0,
        **tune_env,
    )
    (result,) = results
    assert result.status == "TERMINATED"
    assert iterations(result) == [1, 2, 3, 4, 5, 6]
    assert csv_iterations(result) == [1, 2, 3, 4, 5, 6]
    assert [r["training_iteration"] for r in result.history] == [1, 2, 3, 4, 5, 6]


@pytest.mark.integration
def test_a_retry_from_scratch_supersedes_what_the_failed_attempt_logged(tune_env, tmp_path: Path):
    """A function trainable that never checkpoints runs on live under ASHA; it fails at
    iteration 6 once, and its retry starts from scratch: its first 5 results are
    superseded, not logged twice."""
    results = run(
        forgetful_function,
        {"fail_at": 6, "once": str(tmp_path / "once")},
        scheduler=ASHAScheduler(grace_period=1, max_t=8, reduction_factor=2),
        metric="mean_accuracy",
        mode="max",
        stop={"training_iteration": 8},
        max_failures=1,
        name="retry-from-scratch",
        seed=0,
        **tune_env,
    )
    (result,) = results
    assert result.status == "TERMINATED"
    assert iterations(result) == list(range(1, 9))
    assert csv_iterations(result) == list(range(1, 9))


@pytest.mark.integration
def test_a_damaged_checkpoint_falls_back_and_supersedes_the_results_after_it(tune_env):
    """Trial checkpoints every 2 iterations; its newest (6) is damaged before a resume:
    it goes on from checkpoint 4, and iterations 5 and 6 are logged once (the fallback
    used to give [1, ..., 6, 5, 6, 7, ...])."""
    kwargs = dict(
        metric="mean_accuracy",
        mode="max",
        stop={"training_iteration": 10},
        checkpoint_config=CheckpointConfig(checkpoint_frequency=2),
        name="fallback",
        seed=0,
        commit_interval=1e-6,  # a commit per segment: max_rounds counts segments
        **tune_env,
    )
    (first,) = run(ParityTrainable, {"a": 1}, max_rounds=3, scheduler=FIFOScheduler(), **kwargs)
    assert first.status == "PENDING"
    done = iterations(first)
    assert done == list(range(1, len(done) + 1)) and len(done) >= 4
    experiment = os.path.dirname(first.path)
    newest = ExperimentLog(Storage(experiment)).latest()["trials"][0]["restore"]
    pickled = os.path.join(experiment, newest, DICT_CHECKPOINT_FILE)
    data = bytearray(Path(pickled).read_bytes())
    data[-1] ^= 0xFF
    Path(pickled).write_bytes(bytes(data))
    (result,) = run(ParityTrainable, {"a": 1}, resume=True, scheduler=FIFOScheduler(), **kwargs)
    assert result.status == "TERMINATED"
    assert iterations(result) == list(range(1, 11))
    assert csv_iterations(result) == list(range(1, 11))


@pytest.mark.unit
def test_csv_records_are_counted_by_parsing_not_by_lines() -> None:
    text = 'a,b\r\n1,"two\nlines"\r\n2,x\r\n'
    assert csv_prefix_size(text, 1) == len(b"a,b\r\n")
    assert csv_prefix_size(text, 2) == len(b'a,b\r\n1,"two\nlines"\r\n')
    assert csv_prefix_size(text, 3) == len(text.encode())
    assert csv_prefix_size(text, 9) == len(text.encode())


@pytest.mark.unit
def test_rewinding_cuts_both_logs_once_the_commit_after_it_is_durable(tmp_path: Path) -> None:
    """Uncommitted results go at once; committed ones by a cut of the trial's logs that
    waits until the commit after the one recording it is durable (a resume may fall back
    to the commit before, whose sizes count them); the results since then wait too."""
    import pandas as pd

    storage = Storage(str(tmp_path))
    logs = TrialLogs(storage, flush_interval=0.0)
    rec = TrialRecord(trial=Trial(trial_id="t", config={}), index=0, dirname="t")
    folder = tmp_path / "t"
    sizes: dict[str, int] = {}

    def logged() -> list[tuple[int, int]]:
        rows = [json.loads(line) for line in (folder / "result.json").read_text().splitlines()]
        table = pd.read_csv(folder / "progress.csv")
        assert list(table["training_iteration"]) == [r["training_iteration"] for r in rows]
        return [(r["training_iteration"], r["attempt"]) for r in rows]

    def add(attempt: int, *iterations: int) -> None:
        for i in iterations:
            logs.add_result(rec, {"training_iteration": i, "attempt": attempt, "s": "a\nb"})
            rec.num_results += 1

    def settle() -> None:
        settled = logs.settle(final=False)[0]
        sizes.update(settled if isinstance(settled, dict) else settled.items)

    def commit(seq: int) -> dict:
        logs.end_round(seq)
        cuts = logs.take_cuts()
        settle()
        logs.committed()
        settle()  # what it handed over, written
        return cuts

    add(1, 1, 2, 3, 4)
    commit(1)
    add(1, 5, 6)  # not committed yet
    logs.rewind(rec, 5)  # only an uncommitted one goes
    assert rec.num_results == 5 and len(logs.new_results["t"]) == 1
    logs.rewind(rec, 2)  # committed ones too: a cut
    assert rec.num_results == 2 and "t" not in logs.new_results
    assert rec.trial.last_result["training_iteration"] == 2
    add(2, 3)
    assert commit(2) == {"t": [2, 4]}  # kept 2 of the 4 commit 1 counted
    assert logged() == [(1, 1), (2, 1), (3, 1), (4, 1)]  # commit 1 may still be resumed
    assert logs.holding
    add(2, 4)
    assert commit(3) == {}
    assert logged() == [(1, 1), (2, 1), (3, 2), (4, 2)]  # cut, then what waited for it
    assert not logs.holding
    assert sizes["t/result.json"] == os.path.getsize(folder / "result.json")
    assert sizes["t/progress.csv"] == os.path.getsize(folder / "progress.csv")
    logs.close()
