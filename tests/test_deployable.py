"""``flows/record/deployable.py``'s ``experiment`` flow: any experiment from JSON parameters (what
the Prefect UI can send), with clear errors for what it cannot resolve."""

from __future__ import annotations

import base64
import re
import struct

import pytest
from support.prefect_api import artifacts

from popflow.flows.record import deployable
from popflow.schedulers import PopulationBasedTraining
from popflow.schedulers.domains import Categorical, LogUniform

MOCK = "popflow.tune.utils.mock_trainable:MyTrainableClass"


@pytest.mark.integration
def test_an_experiment_runs_from_json_parameters_a_budget_at_a_time(tune_env, monkeypatch):
    monkeypatch.setenv("POPFLOW_STORAGE_ALLOWLIST", tune_env["storage"])  # the owner's root
    params = dict(
        trainable=MOCK,
        param_space={"width": {"randint": [2, 20]}, "height": {"uniform": [10, 100]}},
        scheduler="asha",
        scheduler_args={"time_attr": "training_iteration", "max_t": 8, "grace_period": 2},
        metric="episode_reward_mean",
        mode="max",
        num_samples=6,
        stop={"training_iteration": 8},
        storage=tune_env["storage"],
        name="from-json",
        seed=0,
        max_rounds=1,
        checkpoint_frequency=2,
        dask_address=tune_env["dask_address"].scheduler.address,
        plots=False,
    )
    first = deployable.experiment(**params)
    assert first["experiment"].endswith("/from-json")
    runs = 1
    out = first
    while not out["finished"]:
        out = deployable.experiment(**params)  # resume="auto": each run goes on
        runs += 1
        assert runs < 30
    assert 0 < out["best_metrics"]["episode_reward_mean"] <= 100
    assert set(out["best_config"]) == {"width", "height"}
    # a run of the finished experiment trains nothing; with plots, it draws them
    drawn = deployable.experiment(**{**params, "plots": True})
    (png,) = drawn["plots"]
    assert png == f"{out['experiment']}/plots/metric.png"
    with open(png, "rb") as f:
        drawn_png = f.read()
    assert_png(drawn_png)
    # the newest version: every run's record draws one at its end too (issue 43, 8a)
    artifact = artifacts("from-json-plots")[-1]
    embedded = re.search(
        r"!\[metric.png\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", artifact.data
    )
    assert embedded and base64.b64decode(embedded.group(1)) == drawn_png
    assert f"`{png}`" in artifact.data


def assert_png(data: bytes) -> None:
    """A PNG of a figure's size (its IHDR chunk: width and height in pixels)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 400 and height >= 300, (width, height)


@pytest.mark.unit
def test_json_search_spaces_and_mutations_decode():
    space = deployable.decode_space(
        {"lr": {"loguniform": [1e-4, 1e-1]}, "opt": {"bs": {"choice": [[16, 32]]}}, "n": 3}
    )
    assert isinstance(space["lr"], LogUniform) and space["n"] == 3
    assert isinstance(space["opt"]["bs"], Categorical)
    pbt = deployable.make_scheduler(
        "pbt",
        {"perturbation_interval": 2, "hyperparam_mutations": {"lr": {"uniform": [0, 1]}}},
    )
    assert isinstance(pbt, PopulationBasedTraining)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: deployable.load_trainable("nomodule_xyz:T"), "cannot import 'nomodule_xyz'"),
        (lambda: deployable.load_trainable("popflow"), "must be 'package.module:Name'"),
        (lambda: deployable.load_trainable("popflow:Nope"), "popflow has no 'Nope'"),
        (lambda: deployable.make_scheduler("bohb", None), "must be one of"),
        (lambda: deployable.make_scheduler("asha", {"max_tt": 3}), "`scheduler_args` for 'asha'"),
        (lambda: deployable.decode_space({"lr": {"uniform": 3}}), "needs a list of arguments"),
    ],
)
def test_what_cannot_be_resolved_says_what_to_do(call, message, monkeypatch):
    monkeypatch.setenv("POPFLOW_TRAINABLE_ALLOWLIST", "*")  # an owner who allows any path
    with pytest.raises(ValueError, match=message):
        call()
