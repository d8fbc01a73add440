"""The simulated backend and ``popflow.simulate``: the driver's rounds in this process on a
virtual clock (flows/backends/simulated.py, flows/api/simulate.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainables import Drifting

import popflow
from popflow import (
    ASHAScheduler,
    FIFOScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    PopulationBasedTraining,
    run,
    uniform,
)
from popflow.tasks.progress import VOLATILE_FIELDS, ProgressClock

SPACE = {"lr": uniform(0.0, 1.0)}


def pbt() -> PopulationBasedTraining:
    return PopulationBasedTraining(
        time_attr="training_iteration",  # the same on both clocks
        perturbation_interval=2,
        hyperparam_mutations={"lr": uniform(0.0, 1.0)},
        resample_probability=0.5,
        synch=True,
    )


def histories(folder: Path) -> dict[str, list[dict]]:
    """Each trial's results without the fields that differ between identical runs."""
    out = {}
    for result_json in sorted(folder.glob("*/result.json")):
        rows = [json.loads(line) for line in result_json.read_text().splitlines()]
        out[result_json.parent.name] = [
            {k: v for k, v in r.items() if k not in VOLATILE_FIELDS} for r in rows
        ]
    return out


@pytest.mark.unit
def test_a_reported_time_this_iter_s_is_kept_as_ray_keeps_it():
    """Ray's auto-filled ``time_this_iter_s`` may be overridden by the trainable; the
    totals count what it said (the simulated clock and replayed curves rely on it)."""
    clock = ProgressClock("t")
    first = clock.fill({"time_this_iter_s": 7.5})
    second = clock.fill({"time_this_iter_s": 2.5})
    assert (first["time_this_iter_s"], second["time_total_s"]) == (7.5, 10.0)
    assert second["time_since_restore"] == 10.0


@pytest.mark.unit
def test_a_simulation_replays_the_same_run_and_orders_results_by_virtual_time(tmp_path):
    """Asynchronous ASHA on 3 slots where a result costs ``cost`` virtual seconds: the same
    seed gives the same run, and the clock says when the last segment ended."""
    runs = [
        popflow.simulate(
            Drifting,
            SPACE,
            scheduler=ASHAScheduler(max_t=9, grace_period=1, reduction_factor=3),
            metric="score",
            mode="max",
            num_samples=9,
            slots=3,
            duration="cost",
            stop={"training_iteration": 9},
            storage=str(tmp_path / str(i)),
            seed=4,
        )
        for i in range(2)
    ]
    a, b = runs
    assert histories(tmp_path / "0" / "simulation") == histories(tmp_path / "1" / "simulation")
    assert a.iterations == b.iterations < 9 * 9  # ASHA stopped some trials early
    costs = [r["cost"] for h in histories(tmp_path / "0" / "simulation").values() for r in h]
    assert a.busy_s == pytest.approx(sum(costs))
    assert sum(costs) / 3 <= a.wall_s < sum(costs)  # three slots ran at once


@pytest.mark.unit
def test_replaying_a_finished_experiment_under_fifo_gives_its_curves_back(tmp_path):
    full = popflow.simulate(
        Drifting,
        SPACE,
        metric="score",
        mode="max",
        num_samples=4,
        stop={"training_iteration": 6},
        storage=str(tmp_path),
        name="full",
        seed=1,
    )
    replay = popflow.simulate(curves_from=tmp_path / "full", scheduler=FIFOScheduler())
    recorded = {r.config["lr"]: [h["score"] for h in r.history] for r in full.grid}
    replayed = {
        row.config["lr"]: [h["score"] for h in result.history]
        for row, result in zip(replay.table.itertuples(), replay.grid, strict=True)
    }
    assert replayed == recorded
    assert replay.iterations == full.iterations == 24
    assert (replay.table["iterations"] == replay.table["recorded_iterations"]).all()


@pytest.mark.unit
@pytest.mark.parametrize(
    "scheduler",
    [
        lambda: ASHAScheduler(max_t=8, grace_period=1, reduction_factor=2),
        lambda: HyperBandScheduler(max_t=8, reduction_factor=2),
        lambda: MedianStoppingRule(
            time_attr="training_iteration", grace_period=2, min_samples_required=3
        ),
    ],
    ids=["asha", "hyperband", "median"],
)
def test_early_stopping_replayed_on_recorded_curves_spends_less(tmp_path, scheduler):
    """What would this scheduler have spent on a finished run's curves: fewer iterations
    than the run (every trial to the end), and the best trial is still found."""
    popflow.simulate(
        Drifting,
        SPACE,
        metric="score",
        mode="max",
        num_samples=8,
        stop={"training_iteration": 8},
        storage=str(tmp_path),
        name="recorded",
        seed=2,
    )
    sim = popflow.simulate(curves_from=tmp_path / "recorded", scheduler=scheduler())
    assert sim.iterations < 64
    assert sim.iterations == sim.table["iterations"].sum()
    assert sim.best_metric == pytest.approx(sim.table["recorded_best"].max())


@pytest.mark.unit
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"trainable": Drifting, "curves_from": "x"}, "without a `trainable`"),
        ({}, "give a `trainable`"),
        ({"trainable": Drifting, "param_space": SPACE, "slots": 0}, "`slots` is 0"),
        ({"trainable": Drifting, "param_space": SPACE, "duration": -1}, "`duration` is -1"),
    ],
)
def test_bad_simulation_arguments_are_named(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        popflow.simulate(
            **kwargs,
            metric="score",
            mode="max",
            stop={"training_iteration": 2},
            storage=str(tmp_path),
        )


@pytest.mark.unit
def test_a_duration_key_the_results_lack_errors_the_trials_saying_so(tmp_path):
    sim = popflow.simulate(
        Drifting,
        SPACE,
        metric="score",
        mode="max",
        duration="nope",
        storage=str(tmp_path),
        stop={"training_iteration": 2},
    )
    assert sim.grid.num_errors == 1
    assert "`duration` is 'nope', but a result has nope=None" in str(sim.grid[0].error)


@pytest.mark.unit
def test_the_driver_says_what_happened_as_events(tmp_path):
    """Subscribers see each trial start, each result and decision, each round committed
    (round 0, the sampled population, first) and the run's end, last."""
    from popflow.flows.events import run_events as ev

    seen: list[object] = []
    popflow.simulate(
        Drifting, SPACE, scheduler=pbt(), metric="score", mode="max", num_samples=4,
        stop={"training_iteration": 4}, storage=str(tmp_path), subscribers=[seen.append],
    )  # fmt: skip
    kinds = [type(e).__name__ for e in seen]
    rounds = [e.round for e in seen if isinstance(e, ev.RoundCommitted)]
    assert rounds == list(range(len(rounds))) and len(rounds) > 2
    assert kinds[-1] == "RunEnded" and kinds.count("RunEnded") == 1
    assert kinds.count("TrialResult") == 16 and kinds.count("Decided") == 12  # last: stop
    assert kinds.count("Exploited") == sum(
        len(e.events) for e in seen if isinstance(e, ev.RoundCommitted)
    )
    assert kinds.index("TrialStarted") < kinds.index("TrialResult")


@pytest.mark.system
def test_the_replay_example_prints_each_schedulers_cost(tmp_path):
    """examples/replay_schedulers.py on a finished experiment's folder: a line per scheduler."""
    import subprocess
    import sys

    popflow.simulate(
        Drifting, SPACE, metric="score", mode="max", num_samples=6,
        stop={"training_iteration": 8}, storage=str(tmp_path), name="done", seed=3,
    )  # fmt: skip
    example = Path(__file__).resolve().parent.parent / "examples" / "replay_schedulers.py"
    out = subprocess.run(
        [sys.executable, str(example), str(tmp_path / "done")],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    lines = {line.split("  ")[0]: line.split() for line in out.splitlines()[2:]}
    assert set(lines) == {"as recorded (FIFO)", "ASHA", "HyperBand", "median stopping"}, out
    assert lines["as recorded (FIFO)"][3] == "48"  # every recorded iteration, replayed
    assert int(lines["HyperBand"][1]) < 48, out


@pytest.mark.integration
def test_synch_pbt_decides_the_same_on_the_simulated_backend_as_on_dask(tune_env, tmp_path):
    """The driver is the same on both backends: a seeded synchronous PBT run gives the same
    results, the same exploits (Ray's pbt_global.txt and policy logs) and the same final
    configs on a Dask cluster as simulated in this process."""
    common = {
        "metric": "score",
        "mode": "max",
        "num_samples": 6,
        "stop": {"training_iteration": 8},
        "name": "parity",
        "seed": 7,
    }
    on_dask = run(Drifting, SPACE, scheduler=pbt(), **common, **tune_env)
    sim = popflow.simulate(
        Drifting, SPACE, scheduler=pbt(), slots=2, storage=str(tmp_path), **common
    )
    dask_dir, sim_dir = Path(tune_env["storage"]) / "parity", tmp_path / "parity"
    assert histories(sim_dir) == histories(dask_dir)
    policy = sorted(p.name for p in dask_dir.glob("pbt_policy_*.txt"))
    assert policy and policy == sorted(p.name for p in sim_dir.glob("pbt_policy_*.txt"))
    for name in ["pbt_global.txt", *policy]:
        assert (sim_dir / name).read_text() == (dask_dir / name).read_text(), name
    assert [r.config for r in sim.grid] == [r.config for r in on_dask]
