"""A trial cannot take the run down: whatever its code does, it errors alone."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import pytest
from trainables import Misbehaving

from popflow import ASHAScheduler, run
from popflow.flows.driver.guards import retry_delay


def three_trials(tune_env, name: str, how: str, **kwargs):
    from popflow import grid_search

    return run(
        Misbehaving,
        {"a": 1, "how": how, "at": grid_search([2, 0, 0])},
        stop={"training_iteration": 4},
        metric="mean_accuracy",
        mode="max",
        name=name,
        seed=0,
        **{**tune_env, **kwargs},
    )


@pytest.mark.integration
@pytest.mark.parametrize(
    ("how", "shown"), [("exit", "SystemExit"), ("interrupt", "KeyboardInterrupt")]
)
def test_exiting_or_interrupting_inside_step_errors_that_trial_only(tune_env, how, shown):
    results = three_trials(tune_env, f"exits-{how}", how)
    assert [r.status for r in results] == ["ERROR", "TERMINATED", "TERMINATED"]
    assert shown in str(results[0].error or "")
    assert [r.metrics["training_iteration"] for r in results[1:]] == [4, 4]
    # the workers survived: the shared cluster runs the next test as before
    again = three_trials(tune_env, f"after-{how}", "none")
    assert [r.status for r in again] == ["TERMINATED"] * 3


@pytest.mark.integration
def test_a_metric_of_the_wrong_type_errors_its_trial_naming_trial_and_metric(tune_env):
    results = three_trials(
        tune_env,
        "string-metric",
        "string",
        scheduler=ASHAScheduler(grace_period=1, max_t=4, reduction_factor=2),
    )
    assert results[0].status == "ERROR"
    error = str(results[0].error or "")
    assert results[0].trial_id in error and "'mean_accuracy' = 'high' (str)" in error
    assert "AsyncHyperBandScheduler needs a number" in error
    assert {r.status for r in results[1:]} == {"TERMINATED"}


@pytest.mark.integration
def test_a_metric_never_reported_is_said_once(tune_env, caplog):
    with caplog.at_level(logging.WARNING, logger="popflow.flows"):
        run(
            Misbehaving,
            {"a": 1, "how": "none", "at": 0},
            num_samples=3,
            stop={"training_iteration": 4},
            scheduler=ASHAScheduler(grace_period=1, max_t=4, reduction_factor=2),
            metric="accuracy",  # the trainable reports mean_accuracy
            mode="max",
            name="no-such-metric",
            seed=0,
            **tune_env,
        )
    said = [r for r in caplog.records if "reported no 'accuracy'" in r.getMessage()]
    assert len(said) == 1
    assert "cannot stop, pause or exploit" in said[0].getMessage()


@pytest.mark.integration
def test_retries_back_off_and_a_repeated_error_is_logged_once(tune_env, tmp_path: Path, caplog):
    times = tmp_path / "attempts.txt"
    with caplog.at_level(logging.DEBUG, logger="popflow.flows"):
        results = run(
            Misbehaving,
            {"a": 1, "how": "fail", "at": 1, "times": str(times)},
            num_samples=1,
            stop={"training_iteration": 4},
            max_failures=4,
            name="backoff",
            seed=0,
            **tune_env,
        )
    assert results[0].status == "ERROR" and "deterministic failure" in str(results[0].error or "")
    starts = [float(line) for line in times.read_text().split()]
    assert len(starts) == 5  # the first attempt and 4 retries
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    for n, gap in enumerate(gaps, start=1):
        assert gap >= retry_delay(n), (n, gaps)  # each retry waited out its backoff
    retries = [r for r in caplog.records if "retrying from" in r.getMessage()]
    assert len(retries) == 4
    assert [r.levelno for r in retries] == [logging.WARNING] + [logging.DEBUG] * 3


@pytest.mark.unit
def test_retry_delays_grow_exponentially_to_a_ceiling() -> None:
    delays = [retry_delay(n) for n in range(1, 12)]
    assert delays[:4] == [0.25, 0.5, 1.0, 2.0]
    assert max(delays) == 30.0 and delays == sorted(delays)


@pytest.mark.integration
def test_a_hanging_step_errors_its_trial_after_segment_timeout(tune_env):
    results = three_trials(tune_env, "hangs", "hang", segment_timeout_s=3)
    assert results[0].status == "ERROR"
    assert "segment_timeout_s=3" in str(results[0].error or "")
    assert [r.status for r in results[1:]] == ["TERMINATED", "TERMINATED"]


@pytest.mark.integration
@pytest.mark.parametrize("how", ["os_exit", "sigkill"])
def test_a_trial_whose_process_dies_errors_alone(prefect_server, tmp_path, how):
    """Two of six trials end their worker's process at iteration 2, every time, on the
    embedded cluster (max_failures=1). They error, after their retries; the four that
    shared those processes are run again from their checkpoints, never charged, and
    finish; the run returns (it used to die on a call to a dead worker, or after
    charging healthy trials 'worker ... was lost (3 times in a row)')."""
    from popflow import CheckpointConfig, grid_search
    from popflow.infra.storage.folder import Storage
    from popflow.infra.store.commit_log import ExperimentLog

    results = run(
        Misbehaving,
        {"a": 1, "how": how, "at": grid_search([2, 2, 0, 0, 0, 0])},
        scheduler=ASHAScheduler(grace_period=1, max_t=6, reduction_factor=2),
        metric="mean_accuracy",
        mode="max",
        stop={"training_iteration": 6},
        checkpoint_config=CheckpointConfig(checkpoint_frequency=1),
        max_failures=1,
        storage=str(tmp_path),
        name="dying",
        seed=0,
        n_workers=2,
    )
    assert [r.status for r in results] == ["ERROR"] * 2 + ["TERMINATED"] * 4
    for bad in results[:2]:
        assert "its worker process died while it ran there alone" in str(bad.error or "")
    assert [r.metrics["training_iteration"] for r in results[2:]] == [6] * 4
    trials = ExperimentLog(Storage(results.experiment_path)).latest()["trials"]
    assert [t["num_failures"] for t in trials[2:]] == [0] * 4  # nobody else was charged
    # their retries: max_failures=1 is raised to the floor for lost processes (2)
    assert [t["num_failures"] for t in trials[:2]] == [3, 3]
