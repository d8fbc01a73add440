"""The experiment folder's layout on disk is a format: folders written by earlier versions
resume. This test spells every path literally (it must not use
:mod:`popflow.infra.store.layout`: it checks that module against the folders main wrote)."""

from __future__ import annotations

import os
import re

import pytest

from popflow import run
from popflow.schedulers import PopulationBasedTraining, grid_search
from popflow.tune import with_parameters

pytestmark = pytest.mark.integration

#: The paths a synch PBT run of two trials with ``with_parameters`` leaves after two
#: rounds, each file's name with its variable parts as ``<...>``: what main's code
#: wrote before ``layout`` existed (this test passed on it unchanged).
WRITTEN_BY_MAIN = {
    ".popflow/code.json",
    ".popflow/commits/<8 digits>.json",
    ".popflow/experiment.json",
    ".popflow/lease/<8 digits>.json",
    ".popflow/parameters/<32 hex>.pkl",
    ".popflow/run_args.json",
    ".popflow/run_args.pkl",
    # since issue 47, on a cluster of the user's (this test's): the storage probe, which
    # nothing reads back on a resume (an older folder without it resumes the same)
    ".popflow/storage_probe.json",
    "<trial>/checkpoint_000001/.popflow_manifest.json",
    "<trial>/checkpoint_000001/_dict_checkpoint.pkl",
    "<trial>/checkpoint_000002/.popflow_manifest.json",
    "<trial>/checkpoint_000002/_dict_checkpoint.pkl",
    "<trial>/params.json",
    "<trial>/progress.csv",
    "<trial>/result.json",
    "pbt_global.txt",
    "pbt_policy_<trial id>.txt",
}

SHAPES = [
    (re.compile(r"^\.popflow/(commits|lease)/[0-9]{8}\.json$"), r".popflow/\1/<8 digits>.json"),
    (re.compile(r"^\.popflow/parameters/[0-9a-f]{32}\.pkl$"), ".popflow/parameters/<32 hex>.pkl"),
    (re.compile(r"^pbt_policy_.+\.txt$"), "pbt_policy_<trial id>.txt"),
]


def shapes(root: str, trial_dirs: set[str]) -> set[str]:
    """Every file under ``root``, as a path relative to it with its variable parts named."""
    out = set()
    for folder, _dirs, files in os.walk(root):
        for f in files:
            rel = os.path.relpath(os.path.join(folder, f), root).replace(os.sep, "/")
            head, _, rest = rel.partition("/")
            if head in trial_dirs:
                rel = f"<trial>/{rest}"
            for pattern, shape in SHAPES:
                rel = pattern.sub(shape, rel)
            out.add(rel)
    return out


def test_a_folder_in_mains_layout_is_written_the_same_and_resumes(tune_env):
    from trainables import ParityTrainable

    class WithData(ParityTrainable):
        def setup(self, config, data=None):  # type: ignore[override]
            super().setup(config)
            self.a += sum(data)

    def go(**kwargs):
        return run(
            with_parameters(WithData, data=[0, 0]),
            {"a": grid_search([1, 3])},
            scheduler=PopulationBasedTraining(
                time_attr="training_iteration",
                perturbation_interval=1,
                hyperparam_mutations={"a": [1, 2, 3]},
                quantile_fraction=0.5,
                synch=True,
            ),
            metric="mean_accuracy",
            mode="max",
            stop={"training_iteration": 3},
            name="layout",
            seed=0,
            verbose=0,
            **tune_env,
            **kwargs,
        )

    first = go(max_rounds=2)
    root = os.path.join(tune_env["storage"], "layout")
    trial_dirs = {os.path.basename(r.path) for r in first}
    assert all(re.fullmatch(r"WithData_.+", d) for d in trial_dirs), trial_dirs
    assert shapes(root, trial_dirs) == WRITTEN_BY_MAIN

    grid = go(resume=True)
    assert {os.path.basename(r.path) for r in grid} == trial_dirs
    assert [r.metrics["training_iteration"] for r in grid] == [3, 3]
    assert [len(r.history) for r in grid] == [3, 3]
    assert all(os.path.basename(r.checkpoint.path).startswith("checkpoint_") for r in grid)
