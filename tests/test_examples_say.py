"""The examples say what they need and what they are for, before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.scripts import embedded_env, hiding

pytestmark = pytest.mark.system

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_example(tmp_path, name: str, *args: str, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", name), *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def test_the_torch_example_without_torch_names_the_extra_and_starts_nothing(tmp_path):
    """It used to start the cluster, print two worker tracebacks and "no trial reported a
    finite 'mean_accuracy'"; PyTorch is made unimportable here whether installed or not."""
    env = hiding(tmp_path / "no_torch", {"torch"}, embedded_env(tmp_path / "prefect-home"))
    proc = run_example(tmp_path, "pytorch_cnn.py", "--smoke-test", env=env)
    assert proc.returncode != 0
    assert "pip install 'popflow[torch]'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "Dask" not in proc.stderr + proc.stdout
    assert not (tmp_path / "results").exists()  # nothing started, nothing written


def test_the_rl_example_without_its_libraries_names_the_extra_and_starts_nothing(tmp_path):
    home = tmp_path / "prefect-home"
    env = hiding(tmp_path / "no_rl", {"stable_baselines3", "gymnasium"}, embedded_env(home))
    proc = run_example(tmp_path, "ppo_pbt.py", "--smoke-test", env=env)
    assert proc.returncode != 0
    assert "pip install 'popflow[rl]'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "Dask" not in proc.stderr + proc.stdout
    assert not (tmp_path / "results").exists()


def test_the_deployable_flow_run_directly_says_how_to_deploy_or_run_it(tmp_path):
    proc = run_example(tmp_path, "pbt_benchmark_flow.py")
    assert proc.returncode == 0, proc.stderr
    assert "defines the Prefect flow 'pbt-benchmark' that prefect.yaml deploys" in proc.stdout
    assert "prefect deploy --name pbt-benchmark-smoke" in proc.stdout
    assert "python examples/pbt_benchmark_flow.py --run --smoke-test" in proc.stdout
    assert not (tmp_path / "results").exists()
