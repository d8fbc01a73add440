"""A damaged checkpoint that a trial's exploit cloned, before the trial trained on from it,
and a trial's only checkpoint damaged: synchronous runs still end as an undisturbed run.

The clone gets the cloned state made again (``trial_table.Rebuild``): a segment replays
the source's training from its state before that checkpoint (or from its start), with
the source's config and seeds, its results not logged; the clone then goes on from that
state with the config the exploit chose. Going back to the source's older state instead
trained it under the clone's config and logged over the clone's own results. A trial
never exploited whose only checkpoint is damaged starts again from the beginning (it
ended as ERROR, with fewer results)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_fault_simulation import CrashAtCommit, folder_state

import popflow
from popflow.flows.experiment.commit_paths import UnsafePath, check_commit_paths
from popflow.flows.experiment.commit_shape import problem_of_commit
from popflow.flows.experiment.fallback import (
    FROM_THE_START,
    fall_back_from,
    pinned,
    rebuild_again,
    rebuilt,
)
from popflow.flows.experiment.trial_table import Rebuild, TrialRecord, clone_into
from popflow.flows.simulation import SimulatedCrash
from popflow.flows.simulation.faults import FaultStorage
from popflow.flows.simulation.scenarios import Accumulator
from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import ExperimentLog
from popflow.infra.store.layout import DICT_CHECKPOINT_FILE, checkpoint_path
from popflow.schedulers import (
    PB2,
    Exploit,
    HyperBandScheduler,
    PopulationBasedTraining,
    Trial,
    TrialScheduler,
    uniform,
)
from popflow.tasks.specs import CheckpointRecord

pytestmark = pytest.mark.unit


# -- whole runs on the simulated backend -------------------------------------------------
def pbt() -> TrialScheduler:
    return PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=2,
        hyperparam_mutations={"a": uniform(0.0, 10.0)},
        synch=True,
        metric="score",
        mode="max",
    )


def pb2() -> TrialScheduler:
    return PB2(
        time_attr="training_iteration",
        perturbation_interval=2,
        hyperparam_bounds={"a": [0.0, 10.0]},
        synch=True,
        metric="score",
        mode="max",
    )


def hyperband() -> TrialScheduler:
    return HyperBandScheduler(max_t=6, reduction_factor=2, metric="score", mode="max")


def run(scheduler: Any, storage: Storage, resume: bool = False) -> None:
    popflow.simulate(
        Accumulator,
        {"a": uniform(0.0, 10.0)},
        scheduler=scheduler(),
        num_samples=3,
        stop={"training_iteration": 6},
        slots=2,
        storage=storage,
        name="exp",
        seed=3,
        resume=resume,
    )


def results_of(folder: Path) -> dict[str, Any]:
    """Each trial's results (as :func:`folder_state`, for a run with no exploit log) and
    its committed status."""
    (folder / "pbt_global.txt").touch()
    out = folder_state(folder)
    latest = ExperimentLog(Storage(folder)).latest()
    assert latest is not None
    out["statuses"] = {t["dirname"]: t["status"] for t in latest["trials"]}
    return out


def damage(folder: Path, checkpoint: str) -> None:
    path = folder / checkpoint / DICT_CHECKPOINT_FILE
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def killed_at(tmp_path: Path, scheduler: Any, nth: int) -> tuple[Path, dict[str, Any]] | None:
    """The run killed at its ``nth`` commit: its folder and its last commit (None: it
    finished first)."""
    folder = tmp_path / f"killed{nth}"
    try:
        run(scheduler, FaultStorage.over(Storage(folder), CrashAtCommit(nth)))
    except SimulatedCrash:
        latest = ExperimentLog(Storage(folder / "exp")).latest()
        assert latest is not None
        return folder, latest
    return None


def cloned_states(commit: dict[str, Any]) -> list[str]:
    """Checkpoints of one trial that another trial's exploit cloned and that trial has
    not trained on from yet (its restore and lineage start)."""
    return [
        t["restore"]
        for t in commit["trials"]
        if t["restore"]
        and not t["restore"].startswith(t["dirname"] + "/")
        and (t.get("start") or {}).get("restore") == t["restore"]
    ]


@pytest.mark.parametrize("scheduler", [pbt, pb2], ids=["pbt", "pb2"])
def test_a_clone_whose_cloned_checkpoint_is_damaged_ends_as_an_undisturbed_run(tmp_path, scheduler):
    """Killed right after a round that exploited; the checkpoint the clone (and its source)
    restore from is damaged before the resume: the source falls back, the clone gets the
    state it cloned made again, and the run ends identical to an undisturbed one (the
    clone trained its next iterations from the source's older state under its new config
    and logged them over its own results)."""
    run(scheduler, Storage(tmp_path / "calm"))
    calm = folder_state(tmp_path / "calm" / "exp")
    found = 0
    for nth in range(2, 12):
        killed = killed_at(tmp_path, scheduler, nth)
        if killed is None:
            break
        folder, latest = killed
        shared = cloned_states(latest)
        if not shared:
            continue
        found += 1
        damage(folder / "exp", shared[0])
        run(scheduler, Storage(folder), resume=True)
        assert folder_state(folder / "exp") == calm, f"killed at commit {nth}"
    assert found  # some commit left a clone to restore from its source's checkpoint


def test_a_trial_whose_only_checkpoint_is_damaged_starts_again_and_ends_as_undisturbed(
    tmp_path,
):
    """HyperBand: a paused or pending trial's only checkpoint is damaged before the resume.
    It runs again from its start (its results logged once, its decisions not taken
    again), and the run ends identical to an undisturbed one; it ended as ERROR."""
    run(hyperband, Storage(tmp_path / "calm"))
    calm = results_of(tmp_path / "calm" / "exp")
    found = 0
    for nth in range(2, 12):
        killed = killed_at(tmp_path, hyperband, nth)
        if killed is None:
            break
        folder, latest = killed
        only = [
            t["restore"]
            for t in latest["trials"]
            if t["status"] in ("PENDING", "PAUSED", "RUNNING") and len(t["checkpoints"]) == 1
        ]
        if not only:
            continue
        found += 1
        damage(folder / "exp", only[0])
        run(hyperband, Storage(folder), resume=True)
        assert results_of(folder / "exp") == calm, f"killed at commit {nth}"
    assert found


# -- the trial table's rules -------------------------------------------------------------
def record(i: int, a: float) -> TrialRecord:
    return TrialRecord(trial=Trial(trial_id=f"t{i}", config={"a": a}), index=i, dirname=f"d{i}")


def train(rec: TrialRecord, *iterations: int) -> None:
    results = [{"training_iteration": it} for it in iterations]
    taken = {c.name for c in rec.checkpoints}
    ckpts = []
    for it in iterations:
        name = f"checkpoint_{it:06d}"
        name = name if name not in taken else f"{name}_{rec.exploits}"
        ckpts.append(CheckpointRecord(name, it, {"training_iteration": it}))
    rec.checkpoints.extend(ckpts)
    rec.restore_from(ckpts, results)
    rec.num_results += len(results)
    rec.trial.last_result = results[-1]


def exploit(target: TrialRecord, source: TrialRecord, new: dict[str, Any]) -> None:
    it = source.restore_iteration
    clone_into(
        target,
        source,
        Exploit(
            target.trial_id, source.trial_id, it, it, dict(source.trial.config), new, {}, "", "", ""
        ),
    )


def path(rec: TrialRecord, name: str) -> str:
    return checkpoint_path(rec.dirname, name)


def test_a_clone_of_a_source_with_no_earlier_state_rebuilds_it_from_the_start():
    """The source trained 0..2 in one segment and was never exploited: the clone's state
    is the source's training from the start, with its config and seeds (index,
    generation), through iteration 2; the source itself starts again."""
    src, clone = record(0, 9.0), record(1, 3.0)
    src.generation = 0
    for rec in (src, clone):
        train(rec, 2)
    exploit(clone, src, {"a": 11.0})
    bad = path(src, "checkpoint_000002")
    assert fall_back_from([src, clone], bad) == FROM_THE_START
    assert (src.restore, src.restore_iteration, src.restore_results) == (None, 0, 0)
    assert clone.rebuild == Rebuild("d0", 0, 2, {"a": 9.0}, 0, 0, None, 0)
    assert clone.restore == bad  # not the source's older state under a=11
    assert clone.trial.config == {"a": 11.0}

    made = CheckpointRecord("checkpoint_000002_1", 2, {"training_iteration": 2})
    rebuilt(clone, made)
    assert clone.rebuild is None
    assert (clone.restore, clone.restore_iteration, clone.restore_results) == (
        path(clone, "checkpoint_000002_1"),
        2,
        1,  # its own result at 2 stays: it goes on from the exploit as before
    )
    assert clone.start is not None and clone.start.restore == clone.restore
    assert made.exploit == clone.exploits == 1


def test_an_exploit_of_itself_rebuilds_with_the_config_it_had_then():
    """PBT replay changes a trial's config at an iteration (an exploit of itself): its
    checkpoint there is damaged before it trained on, so it is made again from the one
    before with the old config; never the old state trained under the new config."""
    rec = record(0, 1.0)
    train(rec, 1)
    train(rec, 2)
    exploit(rec, rec, {"a": 5.0})
    assert fall_back_from([rec], path(rec, "checkpoint_000002")) == path(rec, "checkpoint_000001")
    assert rec.rebuild == Rebuild("d0", 0, 2, {"a": 1.0}, 0, 0, path(rec, "checkpoint_000001"), 1)
    assert rec.trial.config == {"a": 5.0}


def test_a_rebuild_whose_start_is_damaged_too_starts_further_back():
    src, clone = record(0, 9.0), record(1, 3.0)
    for it in (1, 2, 3):
        train(src, it)
        train(clone, it)
    exploit(clone, src, {"a": 11.0})
    records = [src, clone]
    fall_back_from(records, path(src, "checkpoint_000003"))
    assert clone.rebuild is not None and clone.rebuild.restore == path(src, "checkpoint_000002")
    assert path(src, "checkpoint_000002") in pinned(records)
    fall_back_from(records, path(src, "checkpoint_000002"))
    assert rebuild_again(records, clone)
    assert clone.rebuild == Rebuild("d0", 0, 3, {"a": 9.0}, 0, 0, path(src, "checkpoint_000001"), 1)
    fall_back_from(records, path(src, "checkpoint_000001"))
    assert rebuild_again(records, clone)
    assert (clone.rebuild.restore, clone.rebuild.iteration) == (None, 0)


def test_a_trial_never_exploited_falls_back_to_its_start_but_not_a_clone_of_another_lineage():
    rec = record(0, 1.0)
    train(rec, 2)
    assert fall_back_from([rec], path(rec, "checkpoint_000002")) == FROM_THE_START
    assert (rec.restore, rec.restore_iteration, rec.restore_results) == (None, 0, 0)

    src, clone = record(0, 9.0), record(1, 3.0)
    for r in (src, clone):
        train(r, 2)
    exploit(clone, src, {"a": 11.0})
    train(clone, 4)  # its own first checkpoint since the exploit, damaged
    src.checkpoints = []  # the cloned state is gone too
    assert fall_back_from([src, clone], path(clone, "checkpoint_000004")) is None


def test_a_pending_rebuild_is_committed_and_its_paths_checked():
    src, clone = record(0, 9.0), record(1, 3.0)
    for rec in (src, clone):
        train(rec, 1)
        train(rec, 2)
    exploit(clone, src, {"a": 11.0})
    fall_back_from([src, clone], path(src, "checkpoint_000002"))
    state = clone.state()
    again = TrialRecord.from_state(state, {})
    assert again.rebuild == clone.rebuild is not None
    commit: dict[str, Any] = {
        "round": 1,
        "trials": [src.state(), state],
        "scheduler": {},
        "derived": {},
    }
    assert problem_of_commit(commit) is None
    check_commit_paths(commit, "mem://exp")
    forged = {**state, "rebuild": {**state["rebuild"], "restore": "../victim/checkpoint_000001"}}
    with pytest.raises(UnsafePath, match="rebuilds"):
        check_commit_paths({**commit, "trials": [src.state(), forged]}, "mem://exp")
    wrong = {**state, "rebuild": {**state["rebuild"], "iteration": 5}}
    assert "rebuild" in (problem_of_commit({**commit, "trials": [src.state(), wrong]}) or "")
