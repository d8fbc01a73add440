"""PopulationBasedTrainingReplay through tune: a recorded lineage's config schedule replays."""

from __future__ import annotations

import json
import os

import pytest
from trainables import ConfigEcho

from popflow import run
from popflow.schedulers import PopulationBasedTraining, PopulationBasedTrainingReplay, choice

pytestmark = pytest.mark.integration


def test_replay_follows_the_recorded_schedule(tune_env):
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=2,
        hyperparam_mutations={"c": [1, 2, 3, 4]},
        resample_probability=0.5,
        synch=True,
    )
    original = run(
        ConfigEcho,
        {"c": choice([1, 2, 3, 4])},
        scheduler=pbt,
        metric="score",
        mode="max",
        num_samples=4,
        stop={"training_iteration": 8},
        name="original",
        seed=3,
        **tune_env,
    )
    exp = original.experiment_path
    lineages = {
        r.trial_id: os.path.join(exp, f"pbt_policy_{r.trial_id}.txt")
        for r in original
        if os.path.exists(os.path.join(exp, f"pbt_policy_{r.trial_id}.txt"))
    }
    assert lineages, "PBT made no exploit to replay"

    # the trial with the longest recorded lineage
    def lineage_length(path: str) -> int:
        with open(path) as f:
            return len(f.readlines())

    trial_id, policy = max(lineages.items(), key=lambda kv: lineage_length(kv[1]))
    with open(policy) as f:
        lines = [json.loads(line) for line in f]
    # Ray's replay: start with the first clone source's config, switch to each
    # exploit's new config after the iteration it cloned at
    expected, config = [], lines[0][4]["c"]
    switches = {line[3]: line[5]["c"] for line in lines}
    for iteration in range(1, 9):
        expected.append(config)
        config = switches.get(iteration, config)
    assert len(set(expected)) > 1  # the schedule really changes c
    final_score = next(r for r in original if r.trial_id == trial_id).metrics["score"]

    replay = run(
        ConfigEcho,
        {"c": 1},  # replaced by the policy's initial config
        scheduler=PopulationBasedTrainingReplay(policy),
        num_samples=1,
        stop={"training_iteration": 8},
        name="replay",
        **tune_env,
    )
    assert [h["c"] for h in replay[0].history] == expected
    # the replayed model is the recorded trial's model: same running score
    assert replay[0].metrics["score"] == final_score
    with open(os.path.join(replay[0].path, "result.json")) as f:
        assert [json.loads(line)["config"]["c"] for line in f] == expected
