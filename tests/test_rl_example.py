"""``examples/ppo_pbt.py``, the reinforcement-learning example, as a user runs it: PBT (and
PB2) over stable-baselines3's PPO on Pendulum-v1, in a fresh process on the embedded
default, with small rollouts (``--smoke-test``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.scripts import embedded_env

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
import ppo_pbt  # noqa: E402  (its BOUNDS; the example imports no RL library at the top)


def run(tmp_path: Path, home: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The example in ``tmp_path``, its Prefect server the one of the Prefect home ``home``."""
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / "ppo_pbt.py"), "--smoke-test", *args],
        cwd=tmp_path, env=embedded_env(home), capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def rows(trial: Path) -> list[dict]:
    return [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]


@pytest.mark.parametrize("scheduler", ["pbt", "pb2"])
def test_the_smoke_run_trains_exploits_and_evaluates_the_best_member(
    tmp_path, prefect_home, scheduler
):
    # synchronous: asynchronous exploits depend on which member reports first, which a
    # busy machine changes (a clone may restore an older checkpoint, or none happen)
    proc = run(tmp_path, prefect_home, "--scheduler", scheduler, "--synch")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 trials, 0 errors" in proc.stdout + proc.stderr
    assert "1 evaluation episodes:" in proc.stdout and "RL Zoo's PPO" in proc.stdout
    experiment = tmp_path / "results" / f"ppo_{scheduler}"
    trials = sorted(experiment.glob("PPOTrainable_*"))
    assert len(trials) == 2
    for trial in trials:
        history = rows(trial)
        # every rollout is 256 steps, and a clone goes on from its donor's step count
        assert [r["timesteps_total"] for r in history] == [256, 512, 768]
        for r in history:  # perturbed settings stay in their ranges (the example's clip)
            for key, (low, high) in ppo_pbt.BOUNDS.items():
                assert low <= r["config"][key] <= high, (key, r["config"][key])
    # interval 1, two members: the worse is replaced by the better at least once
    policies = list(experiment.glob("pbt_policy_*.txt"))
    assert policies and any(p.read_text().strip() for p in policies)
