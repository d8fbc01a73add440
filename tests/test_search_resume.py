"""A search algorithm's state is committed with the rounds: a driver SIGKILLed mid-run
resumes with the same model (tests/crash_driver.py ``--search optuna``: Optuna's TPE,
two trials live at a time, so most trials are suggested after others ended)."""

from __future__ import annotations

import itertools
import os
from collections import Counter

import pytest
from support.driving import drive, read_experiment

from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import ExperimentLog

pytestmark = pytest.mark.system

SEARCH = ["--search", "optuna", "--num-samples", "10", "--iterations", "8"]
BOHB = ["--search", "bohb", "--num-samples", "10", "--iterations", "8"]


def test_a_synchronous_run_with_optuna_killed_twice_ends_identical(prefect_server, tmp_path):
    """HyperBand is synchronous: the kills change nothing, down to every suggested config
    (a resume that started the searcher afresh suggests TPE's first random points again)."""
    crashed = str(tmp_path / "crash")
    assert drive(crashed, "exp", "hyperband", kill_at="commit-after:3", extra=SEARCH) != 0
    assert drive(crashed, "exp", "hyperband", kill_at="append:6", extra=SEARCH) != 0
    drive(crashed, "exp", "hyperband", extra=SEARCH)
    drive(str(tmp_path / "ref"), "exp", "hyperband", extra=SEARCH)
    state = read_experiment(os.path.join(crashed, "exp"))
    assert state == read_experiment(str(tmp_path / "ref" / "exp"))
    assert len(state["trials"]) == 10
    assert len({rows[0]["config"]["a"] for rows in state["trials"].values()}) > 5


def test_a_synchronous_bohb_run_killed_twice_ends_identical(prefect_server, tmp_path):
    """HyperBandForBOHB and TuneBOHB (seeded): the kills change nothing, down to every
    suggested config (the model is rebuilt from the committed calls, its generator too)."""
    crashed = str(tmp_path / "crash")
    assert drive(crashed, "exp", "bohb", kill_at="commit-after:3", extra=BOHB) != 0
    assert drive(crashed, "exp", "bohb", kill_at="append:6", extra=BOHB) != 0
    drive(crashed, "exp", "bohb", extra=BOHB)
    drive(str(tmp_path / "ref"), "exp", "bohb", extra=BOHB)
    state = read_experiment(os.path.join(crashed, "exp"))
    assert state == read_experiment(str(tmp_path / "ref" / "exp"))
    assert len(state["trials"]) == 10 and set(state["status"]) == {"TERMINATED"}
    assert len({rows[0]["config"]["a"] for rows in state["trials"].values()}) > 5


def test_an_asynchronous_run_with_optuna_tells_every_result_once_across_a_crash(
    prefect_server, tmp_path
):
    storage = str(tmp_path)
    assert drive(storage, "exp", "asha", kill_at="commit-after:4", extra=SEARCH) != 0
    drive(storage, "exp", "asha", extra=SEARCH)
    state = read_experiment(os.path.join(storage, "exp"))
    assert len(state["trials"]) == 10 and set(state["status"]) == {"TERMINATED"}
    for results in state["trials"].values():
        iters = [r["training_iteration"] for r in results]
        assert iters == list(range(1, len(iters) + 1))
    calls = ExperimentLog(Storage(os.path.join(storage, "exp"))).latest()["search_calls"]
    told = Counter((c[1], c[2]["training_iteration"]) for c in calls if c[0] == "r")
    recorded = {
        (rows[0]["trial_id"], it)
        for rows in state["trials"].values()
        for it in range(1, len(rows) + 1)
    }
    assert set(told) == recorded and set(told.values()) == {1}
    ended = Counter(c[1] for c in calls if c[0] == "c")
    assert len(ended) == 10 and set(ended.values()) == {1}
    suggested = [c[1] for c in calls if c[0] == "s"]
    assert suggested == sorted(suggested) and len(suggested) == 10
    assert not any(b == a for a, b in itertools.pairwise(suggested))


@pytest.mark.parametrize("scheduler,extra", [("asha", SEARCH), ("bohb", BOHB)])
def test_a_run_killed_before_its_second_commit_resumes_and_ends_every_trial(
    prefect_server, tmp_path, scheduler, extra
):
    """With a search algorithm the first commit holds no trial (none was suggested yet): a
    driver killed right after it left a table that is empty, and so 'ended'. The resume
    said 'already finished' with 0 of 10 trials; it must go on and run them all."""
    storage = str(tmp_path)
    assert drive(storage, "exp", scheduler, kill_at="commit-after:1", extra=extra) != 0
    first = ExperimentLog(Storage(os.path.join(storage, "exp"))).latest()
    assert first["seq"] == 1 and first["trials"] == []  # killed where the bug was
    drive(storage, "exp", scheduler, extra=extra)
    state = read_experiment(os.path.join(storage, "exp"))
    assert len(state["trials"]) == 10 and set(state["status"]) == {"TERMINATED"}
