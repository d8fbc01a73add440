"""PopulationBasedTrainingReplay: policy files in, one trial's config schedule out."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from popflow.schedulers.pbt import PopulationBasedTraining
from popflow.schedulers.pbt_replay import PopulationBasedTrainingReplay
from popflow.schedulers.trial import Trial
from popflow.schedulers.trial_scheduler import Action, Decision

pytestmark = pytest.mark.unit

# t3's policy file. Line 1 is t3's own earlier exploit, superseded when t3 cloned
# t1: it does not chain (its target "3" is not the next line's source "1"). Lines
# 2-3 are t1's history (copied from t1's file) plus t3's clone of t1.
POLICY = [
    ["3", "2", 2, 2, {"lr": 0.5, "bs": 8}, {"lr": 0.6, "bs": 8}],
    ["1", "0", 5, 4, {"lr": 0.1, "bs": 32}, {"lr": 0.12, "bs": 32}],
    ["3", "1", 9, 8, {"lr": 0.12, "bs": 32}, {"lr": 0.096, "bs": 64}],
]


def write_policy(tmp_path: Path, rows: list[Any], name: str = "pbt_policy_t3.txt") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def replay_configs(
    replay: PopulationBasedTrainingReplay, last_iteration: int
) -> tuple[dict[int, dict[str, Any]], list[int | None], list[Decision]]:
    """Run one trial to ``last_iteration``, segment by segment up to each milestone.

    Returns the config each iteration trained with, the milestones, the decisions.
    """
    trial = Trial("r0", replay.complete_config({}))
    replay.on_trial_add(trial)
    used: dict[int, dict[str, Any]] = {}
    milestones: list[int | None] = []
    decisions: list[Decision] = []
    iteration = 0
    while iteration < last_iteration:
        milestone = replay.next_milestone(trial)
        milestones.append(milestone)
        target = last_iteration if milestone is None else min(milestone, last_iteration)
        while iteration < target:
            iteration += 1
            used[iteration] = copy.deepcopy(trial.config)
        decision = replay.on_trial_result(trial, {"training_iteration": iteration})
        decisions.append(decision)
        for ex in decision.exploits:
            assert ex.trial_id == ex.source_trial_id == trial.trial_id
            trial.config = copy.deepcopy(ex.new_config)
    return used, milestones, decisions


def test_replays_the_chained_schedule_at_source_iterations(tmp_path: Path) -> None:
    replay = PopulationBasedTrainingReplay(str(write_policy(tmp_path, POLICY)))
    used, milestones, decisions = replay_configs(replay, 12)
    assert milestones == [4, 8, None]
    expected = {i: {"lr": 0.1, "bs": 32} for i in range(1, 5)}
    expected |= {i: {"lr": 0.12, "bs": 32} for i in range(5, 9)}
    expected |= {i: {"lr": 0.096, "bs": 64} for i in range(9, 13)}
    assert used == expected
    first = decisions[0].exploits[0]
    assert (first.target_iteration, first.source_iteration) == (4, 4)
    assert first.source_config == {"lr": 0.1, "bs": 32}
    assert first.operations == {"lr": "replay"}
    assert first.new_tag == "replay_pbt_policy_t3.txt@perturbed[bs=32,lr=0.1200]"
    assert decisions[-1] == Decision(Action.CONTINUE)
    assert replay.debug_string() == "PopulationBasedTraining replay: Step 12, perturb 2"


def test_skipped_change_points_are_applied_together() -> None:
    replay = PopulationBasedTrainingReplay("p.txt", lines=[json.dumps(row) for row in POLICY])
    trial = Trial("r0", replay.complete_config({}))
    replay.on_trial_add(trial)
    decision = replay.on_trial_result(trial, {"training_iteration": 10})
    (ex,) = decision.exploits
    assert ex.new_config == {"lr": 0.096, "bs": 64}
    assert replay.next_milestone(trial) is None


def test_results_before_a_change_point_continue() -> None:
    replay = PopulationBasedTrainingReplay("p.txt", lines=[json.dumps(POLICY[-1])])
    trial = Trial("r0", replay.complete_config({}))
    replay.on_trial_add(trial)
    assert replay.on_trial_result(trial, {"training_iteration": 7}) == Decision(Action.CONTINUE)
    assert replay.on_trial_result(trial, {"loss": 1.0}) == Decision(Action.CONTINUE)
    assert replay.on_trial_result(trial, {"training_iteration": 8}).exploits


def test_complete_config_returns_the_policy_initial_config(
    caplog: pytest.LogCaptureFixture,
) -> None:
    replay = PopulationBasedTrainingReplay("p.txt", lines=[json.dumps(row) for row in POLICY])
    config = replay.complete_config({})
    assert config == {"lr": 0.1, "bs": 32}
    config["lr"] = 99
    with caplog.at_level(logging.WARNING, logger="popflow.schedulers.pbt_replay"):
        assert replay.complete_config({"lr": 3}) == {"lr": 0.1, "bs": 32}
    assert "replaces the trial's config" in caplog.text


def test_only_one_trial(tmp_path: Path) -> None:
    replay = PopulationBasedTrainingReplay(write_policy(tmp_path, POLICY))
    replay.on_trial_add(Trial("a", {}))
    replay.on_trial_add(Trial("a", {}))  # the same trial again (resume) is fine
    with pytest.raises(ValueError, match=r"trains one trial, but trial b was added after a"):
        replay.on_trial_add(Trial("b", {}))


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "pbt_policy_nope.txt"
    with pytest.raises(FileNotFoundError, match=r"PBT policy file not found: .*pbt_policy_nope"):
        PopulationBasedTrainingReplay(str(path))


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", r"PBT policy file .*pbt_policy_bad\.txt is empty"),
        ("\n  \n", r"pbt_policy_bad\.txt is empty"),
        (json.dumps(POLICY[0]) + "\n{not json\n", r"pbt_policy_bad\.txt, line 2: not JSON"),
        ('["1", "0", 5, 4, {"lr": 0.1}]\n', r"line 1: expected \[target_tag, source_tag, target"),
        ('["1", "0", "5", 4, {}, {}]\n', r"line 1: expected"),
        ('["1", "0", 5, 4, {}, [1]]\n', r"line 1: expected"),
    ],
)
def test_empty_or_malformed_file(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "pbt_policy_bad.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        PopulationBasedTrainingReplay(path)


def test_state_round_trip(tmp_path: Path) -> None:
    path = write_policy(tmp_path, POLICY)
    a = PopulationBasedTrainingReplay(path)
    trial = Trial("r0", a.complete_config({}))
    a.on_trial_add(trial)
    a.on_trial_result(trial, {"training_iteration": 4})
    b = PopulationBasedTrainingReplay(path)
    b.set_state(json.loads(json.dumps(a.get_state())))
    assert b.next_milestone(trial) == a.next_milestone(trial) == 8
    for it in (6, 8, 12):
        result = {"training_iteration": it}
        assert a.on_trial_result(trial, result) == b.on_trial_result(trial, result)
    assert a.get_state() == b.get_state()


# -- oracle: replaying a PBT run's policy file retraces the lineage's configs ----
def run_pbt_logging_policies(
    seed: int,
) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[str]]]:
    """Asynchronous PBT, round robin, on a fake backend whose model records the config
    each iteration trained with. Policy lines are written the way Ray's infra does:
    the target's file becomes a copy of the source's (if any), plus the new line."""
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        metric="score",
        mode="max",
        perturbation_interval=2,
        hyperparam_mutations={"lr": lambda: 0.05, "bs": [16, 32, 64]},
        quantile_fraction=0.5,
        rng=np.random.default_rng(seed),
    )
    trials = []
    for i in range(4):
        config = pbt.complete_config({"lr": 0.01 * (i + 1), "bs": 32})
        trial = Trial(f"t{i}", config, experiment_tag=str(i))
        pbt.on_trial_add(trial)
        trials.append(trial)
    by_id = {t.trial_id: t for t in trials}
    model = {t.trial_id: {"iter": 0, "w": 0.0, "hist": []} for t in trials}
    checkpoint = copy.deepcopy(model)
    policy: dict[str, list[str]] = {t.trial_id: [] for t in trials}
    for _ in range(6):
        for trial in trials:
            state = model[trial.trial_id]
            while state["iter"] < pbt.next_milestone(trial):
                state["iter"] += 1
                state["w"] += trial.config["lr"] * trial.config["bs"]
                state["hist"].append(copy.deepcopy(trial.config))
            checkpoint[trial.trial_id] = copy.deepcopy(state)
            result = {"training_iteration": state["iter"], "score": state["w"]}
            decision = pbt.on_trial_result(trial, result)
            trial.last_result = result
            for ex in decision.exploits:
                model[ex.trial_id] = copy.deepcopy(checkpoint[ex.source_trial_id])
                by_id[ex.trial_id].config = copy.deepcopy(ex.new_config)
                if policy[ex.source_trial_id]:
                    policy[ex.trial_id] = list(policy[ex.source_trial_id])
                policy[ex.trial_id].append(json.dumps(ex.policy_entry()))
    return {tid: m["hist"] for tid, m in model.items()}, policy


@pytest.mark.parametrize("seed", range(5))
def test_replaying_a_pbt_policy_retraces_the_trained_configs(tmp_path: Path, seed: int) -> None:
    history, policy = run_pbt_logging_policies(seed)
    replayed = 0
    for trial_id, lines in policy.items():
        if not lines:
            continue
        path = tmp_path / f"pbt_policy_{trial_id}.txt"
        path.write_text("\n".join(lines) + "\n")
        used, _, _ = replay_configs(PopulationBasedTrainingReplay(path), len(history[trial_id]))
        assert [used[i] for i in sorted(used)] == history[trial_id]
        replayed += 1
    assert replayed >= 1
