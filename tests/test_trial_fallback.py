"""The trial table's rules about what survives a fault: a damaged checkpoint's fallback
follows the trial's lineage (never a state from before an exploit under the config the
exploit chose), a trial's first config outlives its exploits (its params.json), and an
experiment is finished only when its search is exhausted and every trial ended (a
searcher's first commit holds no trial)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from popflow.flows.driver.retention import retire_checkpoints
from popflow.flows.experiment.commit_paths import UnsafePath, check_commit_paths
from popflow.flows.experiment.commit_shape import problem_of_commit
from popflow.flows.experiment.fallback import fall_back_from, pinned
from popflow.flows.experiment.opening import remove_uncommitted
from popflow.flows.experiment.trial_table import Rebuild, TrialRecord, clone_into, is_finished
from popflow.flows.spec.config import CheckpointConfig
from popflow.infra.storage.folder import Storage
from popflow.infra.store.layout import PARAMS, checkpoint_path
from popflow.schedulers import Exploit, Trial, TrialStatus
from popflow.tasks.specs import CheckpointRecord

pytestmark = pytest.mark.unit


def record(i: int, a: int) -> TrialRecord:
    return TrialRecord(trial=Trial(trial_id=f"t{i}", config={"a": a}), index=i, dirname=f"d{i}")


def train(rec: TrialRecord, *iterations: int) -> None:
    """A segment of ``rec`` logged a result and published a checkpoint at each iteration."""
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


def exploit(target: TrialRecord, source: TrialRecord) -> None:
    """``target`` clones ``source``'s newest state, and its config."""
    it_t = target.trial.last_result["training_iteration"]
    it_s = source.restore_iteration
    new = dict(source.trial.config)
    clone_into(
        target,
        source,
        Exploit(
            target.trial_id, source.trial_id, it_t, it_s, source.trial.config, new, {}, "", "", ""
        ),
    )


def path(rec: TrialRecord, iteration: int) -> str:
    return checkpoint_path(rec.dirname, f"checkpoint_{iteration:06d}")


def synch_pair() -> tuple[TrialRecord, TrialRecord]:
    """Synchronous PBT: t1 (a=20) clones t0 (a=40) at iteration 2, then trains 3."""
    src, clone = record(0, 40), record(1, 20)
    for rec in (src, clone):
        train(rec, 1)
        train(rec, 2)
    exploit(clone, src)
    train(src, 3)
    train(clone, 3)
    return src, clone


def test_a_damaged_first_checkpoint_after_an_exploit_falls_back_to_the_cloned_state():
    src, clone = synch_pair()
    assert fall_back_from([src, clone], path(clone, 3)) == path(src, 2)
    # the state the exploit cloned, under the config it chose (not its own a=20 state
    # at iteration 2, which it went on from before)
    assert (clone.restore, clone.restore_iteration) == (path(src, 2), 2)
    assert clone.trial.config == {"a": 40}
    assert clone.restore_results == 2  # its own results through the exploit stay
    clone.replay_after_rewind()
    assert clone.replay_through == 3  # iteration 3 runs again, decided on once


def test_a_damaged_later_checkpoint_falls_back_to_one_written_since_the_exploit():
    src, clone = synch_pair()
    train(clone, 4)
    assert fall_back_from([src, clone], path(clone, 4)) == path(clone, 3)
    assert (clone.restore_iteration, clone.restore_results) == (3, 3)


def test_no_fallback_when_the_cloned_state_is_gone_rather_than_a_pre_exploit_one():
    """The source's checkpoint was retired (a commit from before sources were kept) or
    found damaged: the trial cannot go on; its own iteration-2 state is no fallback."""
    src, clone = synch_pair()
    src.checkpoints = [c for c in src.checkpoints if c.iteration != 2]
    assert fall_back_from([src, clone], path(clone, 3)) is None


def test_a_clone_of_a_clone_falls_back_to_its_own_source():
    src, mid = synch_pair()
    last = record(2, 10)
    for it in (1, 2, 3):
        train(last, it)
    exploit(last, mid)  # last clones mid's state at 3, itself cloned from src at 2
    train(last, 4)
    records = [src, mid, last]
    assert fall_back_from(records, path(last, 4)) == path(mid, 3)
    assert last.restore_results == 3
    # mid's checkpoint 3 turns out damaged too: mid follows its lineage back to the state
    # it cloned from src; last gets mid's state at 3 made again from there (mid's config
    # and seeds), never src's state at 2 under its own config
    assert fall_back_from(records, path(mid, 3)) == path(src, 2)
    assert mid.restore == path(src, 2)
    assert last.rebuild == Rebuild("d1", 1, 3, {"a": 40}, 1, 1, path(src, 2), 2)


def test_a_clone_of_a_damaged_source_checkpoint_follows_the_source_back():
    """The source's checkpoint the clone restores from is damaged: the source goes on
    from its state before it, and the clone gets the cloned state made again from there
    (asynchronous PBT too: by lineage, not by the clone's iteration)."""
    src, clone = record(0, 40), record(1, 20)
    for it in range(1, 7):
        train(src, it)
    for it in range(1, 11):
        train(clone, it)
    exploit(clone, src)  # at iteration 10, from src's 6
    assert clone.restore == path(src, 6)
    assert fall_back_from([src, clone], path(src, 6)) == path(src, 5)
    assert src.restore == path(src, 5)
    assert clone.rebuild == Rebuild("d0", 0, 6, {"a": 40}, 0, 0, path(src, 5), 5)
    assert clone.restore_results == 10  # asynchronous: its own 10 results stay


def test_the_cloned_state_is_kept_and_committed_with_the_trial():
    src, clone = synch_pair()
    train(src, 4)
    train(clone, 4)
    records = [src, clone]
    assert path(src, 2) in pinned(records)
    retired = retire_checkpoints(records, CheckpointConfig(num_to_keep=1))
    assert ("d0", "checkpoint_000002") not in retired
    assert ("d0", "checkpoint_000001") in retired
    clone.trial.status = TrialStatus.TERMINATED
    assert path(src, 2) not in pinned(records)

    state = clone.state()
    again = TrialRecord.from_state(state, {})
    assert again.start == clone.start and again.checkpoints == clone.checkpoints
    assert [c.exploit for c in again.checkpoints] == [1]  # kept: its newest, since the exploit
    commit: dict[str, Any] = {
        "round": 1,
        "trials": [src.state(), state],
        "scheduler": {},
        "derived": {},
    }
    assert problem_of_commit(commit) is None
    check_commit_paths(commit, "mem://exp")
    forged = {**state, "start": {**state["start"], "restore": "../../victim/checkpoint_000001"}}
    with pytest.raises(UnsafePath, match="lineage"):
        check_commit_paths({**commit, "trials": [src.state(), forged]}, "mem://exp")


def test_a_params_json_written_on_resume_holds_the_config_the_trial_started_with(tmp_path):
    """The driver died after the commit that started the trial and then exploited it, before
    it wrote its params.json: the resume writes the first config (Ray's), not the exploit's
    (it wrote a=40 for a trial that started with a=20). The first config is committed with
    the trial once an exploit changes its config; older commits lack it."""
    _, clone = synch_pair()  # clone started with a=20, took a=40 at its exploit
    exploit(clone, clone)  # a second exploit (its own state, resampled): still a=20 first
    state = json.loads(json.dumps(clone.state()))  # as a commit stores it
    assert state["config"] == {"a": 40} and state["first_config"] == {"a": 20}
    assert (
        problem_of_commit({"round": 1, "trials": [state], "scheduler": {}, "derived": {}}) is None
    )
    again = TrialRecord.from_state(state, {})
    assert again.params == {"a": 20} and again.trial.config == {"a": 40}
    (tmp_path / again.dirname).mkdir()
    remove_uncommitted(Storage(str(tmp_path)), [again])
    assert json.loads((tmp_path / again.dirname / PARAMS).read_text()) == {"a": 20}

    older = {k: v for k, v in state.items() if k != "first_config"}
    assert TrialRecord.from_state(older, {}).params == {"a": 40}  # as before: its config
    wrong = {**state, "first_config": [1]}
    assert "first_config" in problem_of_commit(
        {"round": 1, "trials": [wrong], "scheduler": {}, "derived": {}}
    )


def test_old_checkpoints_without_a_lineage_mark_fall_back_by_iteration():
    """Commits written before the mark was kept: as before, the owner's newest earlier."""
    rec = record(0, 1)
    for it in (1, 2, 3):
        train(rec, it)
    for c in rec.checkpoints:
        c.exploit = None
    assert fall_back_from([rec], path(rec, 3)) == path(rec, 2)


def commit(trials: list[str], search: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"trials": [{"status": s} for s in trials]}
    if search is not None:
        out["search"] = search
    return out


@pytest.mark.parametrize(
    "trials,search,finished",
    [
        ([], {"created": 0, "finished": False, "waiting": [], "more": True}, False),
        (["TERMINATED"] * 3, {"created": 3, "finished": False, "more": True}, False),
        (["TERMINATED"] * 8, {"created": 8, "finished": False, "more": False}, True),
        (["TERMINATED", "ERROR"], {"created": 2, "finished": True, "more": False}, True),
        (["TERMINATED", "PAUSED"], {"created": 2, "finished": True, "more": False}, False),
        (["TERMINATED", "ERROR"], None, True),  # no searcher: the table is the population
        ([], {"created": 0, "finished": False, "waiting": []}, False),  # older commit 1
        ([], {"created": 0, "finished": True, "waiting": []}, True),  # FINISHED at once
    ],
)
def test_finished_means_the_search_is_exhausted_and_every_trial_ended(trials, search, finished):
    assert is_finished(commit(trials, search)) is finished
