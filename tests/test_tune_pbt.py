"""PBT end to end through ``tune``: Prefect flow, Dask workers, local storage."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.sorting import FlowRunSort
from support.parity import parity_run, parity_scheduler, parity_space
from trainables import (
    EndsEarlyTrainable,
    FlakyTrainable,
    ParityTrainable,
    SetupCountingTrainable,
    StopOnlyOnTheDriver,
    parity_function,
)

from popflow import CheckpointConfig, run
from popflow.flows.backends.dask_backend import CodeUnavailable, DaskBackend
from popflow.flows.experiment.opening import is_finished
from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import ExperimentLog
from popflow.schedulers import PopulationBasedTraining, sample_from

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("trainable", "values", "expected"),
    [
        (parity_function, [10, 20, 40], 43),
        (ParityTrainable, [10, 20, 40], 43),
        (ParityTrainable, [30, 20, 10], 33),
    ],
)
def test_synch_pbt_matches_ray(tune_env, trainable, values, expected):
    results = run(
        trainable,
        parity_space(values),
        scheduler=parity_scheduler(synch=True),
        metric="mean_accuracy",
        mode="max",
        num_samples=3,
        stop={"training_iteration": 3},
        name="parity",
        seed=0,
        **tune_env,
    )
    finals = [r.metrics["mean_accuracy"] for r in results]
    assert finals == [expected] * 3
    assert all(r.status == "TERMINATED" and r.metrics["training_iteration"] == 3 for r in results)
    assert results.get_best_result().metrics["mean_accuracy"] == expected


def test_async_pbt_exploits_and_finishes(prefect_server, tmp_path):
    # One slot makes the report order fixed (least progress first, ties in add order):
    # 0, 1, 2 at iteration 1, then 0 at 2. Under Ray's rule a source must have ranked top
    # at its own latest perturbation, so on two slots the order decides whether the
    # worst trial ever meets a clonable source before it stops (CI saw it not).
    results = parity_run(
        [10, 20, 40],
        synch=False,
        name="parity_async",
        seed=0,
        storage=str(tmp_path / "results"),
        n_workers=1,
    )
    assert [r.metrics["training_iteration"] for r in results] == [3, 3, 3]
    # at iteration 2 the worst trial (a=10) is bottom and trial 2 (a=40) top and clonable
    # since its first report: it clones a=40 and ends at 40 + 3
    assert results[0].metrics["a"] == 40
    assert results[0].metrics["mean_accuracy"] == 43
    exp = results.experiment_path
    lines = read_lines(os.path.join(exp, "pbt_global.txt"))
    assert lines and all(len(line) == 6 for line in lines)


def read_lines(path: str) -> list:
    with open(path) as f:
        return [json.loads(line) for line in f]


def test_storage_layout_and_pbt_logs(tune_env):
    results = parity_run(
        [10, 20, 40],
        checkpoint_config=CheckpointConfig(checkpoint_frequency=1),
        name="layout",
        seed=0,
        **tune_env,
    )
    exp = results.experiment_path
    glob = read_lines(os.path.join(exp, "pbt_global.txt"))
    # round 1: trial 0 (a=10) clones trial 2 (a=40) at iteration 1; round 2: trial 1 clones
    assert [(g[2], g[3]) for g in glob] == [(1, 1), (2, 2)]
    assert all(g[4]["a"] == 40 for g in glob)
    for r in results:
        files = set(os.listdir(r.path))
        assert {"params.json", "result.json", "progress.csv"} <= files
        assert {f"checkpoint_{i:06d}" for i in (1, 2, 3)} <= files
        rows = read_lines(os.path.join(r.path, "result.json"))
        assert [row["training_iteration"] for row in rows] == [1, 2, 3]
        assert all(row["trial_id"] == r.trial_id and "config" in row for row in rows)
        with open(os.path.join(r.path, "progress.csv")) as f:
            assert len(f.read().strip().splitlines()) == 4  # header + 3 rows
    # the lineage of trial 1 (cloned in round 2 from trial 2): its policy file holds that exploit
    policy = read_lines(os.path.join(exp, f"pbt_policy_{results[1].trial_id}.txt"))
    assert policy[-1][:4] == glob[1][:4]


def test_retention_keeps_what_is_still_needed(tune_env):
    results = parity_run(
        [10, 20, 40],
        iterations=6,
        checkpoint_config=CheckpointConfig(
            checkpoint_frequency=1, num_to_keep=1, checkpoint_score_attribute="mean_accuracy"
        ),
        name="retention",
        seed=0,
        **tune_env,
    )
    exp = results.experiment_path
    log = ExperimentLog(Storage(exp))
    for seq in log.commit_numbers():
        state = log.read(seq)
        for t in state["trials"]:
            kept = [c["name"] for c in t["checkpoints"]]
            # the best and the newest at most, plus what some trial restores from
            restores = {s["restore"] for s in state["trials"] if s["restore"]}
            assert len([k for k in kept if f"{t['dirname']}/{k}" not in restores]) <= 2
    final = state["trials"]
    for t in final:
        if t["restore"]:
            assert os.path.exists(os.path.join(exp, t["restore"], ".popflow_manifest.json"))
    assert [r.metrics["mean_accuracy"] for r in results] == [46, 46, 46]


def test_failed_trial_is_reported_and_others_finish(tune_env):
    results = run(
        FlakyTrainable,
        {"fail_at": sample_from(lambda spec: None)},
        num_samples=1,
        stop={"training_iteration": 4},
        name="ok",
        **tune_env,
    )
    assert results[0].error is None
    results = run(
        FlakyTrainable,
        {"fail_at": 3},
        num_samples=2,
        stop={"training_iteration": 4},
        name="errors",
        **tune_env,
    )
    assert results.num_errors == 2
    assert all("boom at iteration 3" in str(e) for e in results.errors)
    assert all(r.status == "ERROR" for r in results)
    assert os.path.exists(os.path.join(results[0].path, "error.txt"))


def test_max_failures_retries_from_last_checkpoint(tune_env, tmp_path):
    results = run(
        FlakyTrainable,
        {"fail_at": 3, "marker": str(tmp_path / "failed-once")},
        num_samples=1,
        stop={"training_iteration": 5},
        checkpoint_config=CheckpointConfig(checkpoint_frequency=2),
        max_failures=1,
        name="retry",
        **tune_env,
    )
    r = results[0]
    assert r.error is None and r.status == "TERMINATED"
    # restored from iteration 2 after the failure at 3: the value counts on, nothing repeated
    assert [h["training_iteration"] for h in r.history] == [1, 2, 3, 4, 5]
    assert r.metrics["score"] == 5.0


def test_existing_experiment_is_not_overwritten(tune_env):
    kwargs = dict(num_samples=1, stop={"training_iteration": 1}, name="twice", **tune_env)
    first = run(ParityTrainable, {"a": 1}, **kwargs)
    second = run(ParityTrainable, {"a": 1}, **{**kwargs, "stop": {"training_iteration": 2}})
    assert second.experiment_path.endswith("/twice_2")
    assert first.experiment_path.endswith("/twice")
    # the first is as it was
    again = run(ParityTrainable, {"a": 1}, resume=True, **kwargs)
    assert [r.metrics["training_iteration"] for r in again] == [1]


def test_synch_barrier_releases_when_a_trial_finishes_mid_round(tune_env):
    """Ray's synch PBT hangs when the trial everyone waits for ends; popflow must not."""
    values = iter([(10, None), (20, 3), (40, None)])

    def pick(_):
        return next(values)

    space = {
        "pair": sample_from(pick),
        "a": sample_from(lambda spec: spec["pair"][0]),
        "done_at": sample_from(lambda spec: spec["pair"][1]),
    }
    results = run(
        EndsEarlyTrainable,
        space,
        scheduler=PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=2,
            hyperparam_mutations={"c": lambda: 1},
            synch=True,
        ),
        metric="mean_accuracy",
        mode="max",
        num_samples=3,
        stop={"training_iteration": 6},
        name="barrier",
        seed=0,
        **tune_env,
    )
    assert [r.status for r in results] == ["TERMINATED"] * 3
    # trial 1 (a=20) ends at 3, inside the round whose barrier is at 4; trial 0 cloned
    # trial 2 at 2 (so lost its own done_at); without the release both would wait forever
    assert [r.metrics["training_iteration"] for r in results] == [6, 3, 6]


def test_synch_pbt_keeps_trainables_alive_across_the_barrier(tune_env, tmp_path):
    """A synch round pauses every trial at the barrier; only clones are rebuilt from storage."""
    setups = tmp_path / "setups"
    setups.mkdir()
    results = run(
        SetupCountingTrainable,
        param_space={**parity_space([10, 20, 40, 30]), "setups": str(setups)},
        scheduler=parity_scheduler(synch=True),
        metric="mean_accuracy",
        mode="max",
        num_samples=4,
        stop={"training_iteration": 6},
        name="alive",
        seed=0,
        **tune_env,
    )
    assert not results.errors
    with open(os.path.join(tune_env["storage"], "alive", "pbt_global.txt")) as f:
        exploits = sum(1 for line in f if line.strip())
    assert exploits >= 1
    # one set-up per trial, plus one per clone; never one per round (6 rounds)
    assert len(os.listdir(setups)) == 4 + exploits


def test_segments_a_worker_cannot_unpickle_fail_the_run_at_once_and_keep_the_workers(tune_env):
    """Every trial would fail alike: one clear error, not N errored trials in a run that
    ends Completed (and the experiment stays resumable once the code is there)."""
    client = tune_env["dask_address"]
    workers = set(client.scheduler_info()["workers"])
    with pytest.raises(CodeUnavailable) as raised:
        parity_run(
            [10, 20, 30],
            synch=False,
            stop=StopOnlyOnTheDriver(),
            name="unreadable",
            **tune_env,
        )
    message = str(raised.value)
    assert "cannot unpickle the segments" in message
    assert "only unpickles where it was made" in message
    assert "The Dask workers cannot load the trials' code" in message
    assert set(client.scheduler_info()["workers"]) == workers  # no worker was given up
    latest = ExperimentLog(Storage(tune_env["storage"]).child("unreadable")).latest()
    assert latest is not None and not is_finished(latest)

    async def states() -> list[str]:
        async with get_client() as api:
            runs = await api.read_flow_runs(sort=FlowRunSort.EXPECTED_START_TIME_DESC)
        return [r.state.type.value for r in runs if r.parameters.get("name") == "unreadable"]

    assert asyncio.run(states()) == ["FAILED"]  # the tune flow run, in the Prefect API


def test_a_lambda_stop_condition_reaches_the_workers(tune_env):
    """Plain pickle cannot send a lambda; the segments still get to the runners."""
    limit = 4
    results = parity_run(
        [10, 20],
        stop=lambda trial_id, result: result["training_iteration"] >= limit,
        name="lambda_stop",
        **tune_env,
    )
    assert not results.errors
    assert [r.metrics["training_iteration"] for r in results] == [limit, limit]


@pytest.mark.parametrize("log_config", [True, False])
def test_log_config_decides_whether_exploits_are_written_to_policy_files(tune_env, log_config):
    scheduler = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=1,
        hyperparam_mutations={"c": lambda: 1},
        synch=True,
        log_config=log_config,
    )
    results = run(
        ParityTrainable,
        parity_space([10, 20, 40]),
        scheduler=scheduler,
        metric="mean_accuracy",
        mode="max",
        num_samples=3,
        stop={"training_iteration": 3},
        name=f"log_config_{log_config}",
        seed=0,
        **tune_env,
    )
    assert [r.metrics["mean_accuracy"] for r in results] == [43] * 3  # it exploited either way
    files = os.listdir(results.experiment_path)
    policies = [f for f in files if f.startswith("pbt_policy_")]
    assert ("pbt_global.txt" in files) is log_config
    assert bool(policies) is log_config


@pytest.mark.parametrize("scheduler", ["async_pbt", "fifo"])
def test_async_pbt_chooses_each_trial_as_a_slot_frees(tune_env, monkeypatch, scheduler):
    """Asynchronous PBT time-shares the slots, as Ray pauses a trial at its perturbation
    point while others wait: a call per free slot, one trial each, chosen when the slot
    frees. Other asynchronous schedulers keep two calls a slot queued."""
    in_flight: list[tuple[int, int]] = []  # (calls in flight before a submit, its trials)
    submit = DaskBackend.submit

    def watched(self: DaskBackend, recs: list, specs: list, runner: object) -> None:
        in_flight.append((len(self.in_flight), len(recs)))
        submit(self, recs, specs, runner)

    monkeypatch.setattr(DaskBackend, "submit", watched)
    results = run(
        ParityTrainable,
        parity_space(list(range(6))),
        scheduler=parity_scheduler(synch=False) if scheduler == "async_pbt" else None,
        metric="mean_accuracy",
        mode="max",
        num_samples=6,
        stop={"training_iteration": 4},
        name=f"slots_{scheduler}",
        seed=0,
        **tune_env,
    )
    assert [r.metrics["training_iteration"] for r in results] == [4] * 6
    most = max(calls for calls, _ in in_flight)
    if scheduler == "async_pbt":
        assert most < 2  # 2 slots: a call is sent only while a slot is free
        assert all(trials == 1 for _, trials in in_flight)
        # a call per segment, a segment per perturbation interval (1 iteration here)
        assert len(in_flight) == sum(len(r.metrics_dataframe) for r in results) >= 6 * 4
    else:
        assert most >= 3  # 4 calls queued on 2 slots at the start
