"""Checkpoint names no other driver epoch writes (issue 46, the second adversarial pass).

A driver stopped (SIGSTOP, a stall past its lease) inside a publish or inside its resume's
removal of orphan checkpoints, woken after a newer driver published and committed the same
iteration, and killed there, once left its own version under the newer driver's name, or
lost the newer driver's checkpoint (its swap-back never ran). Now a name says which epoch
alone publishes it (``checkpoint_000002`` epoch 1's, ``checkpoint_000002_e3`` epoch 3's):
the newer driver's checkpoint is under a name the stale one never writes nor deletes.
Each test stops the stale driver at every storage call of the step, runs the newer driver
there, then lets the stale one go on (a stall) or kills it (a crash).
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from support.trees import write_tree

import popflow
from popflow.flows.experiment.opening import remove_uncommitted
from popflow.flows.experiment.trial_table import TrialRecord
from popflow.flows.simulation import SimulatedCrash
from popflow.flows.simulation.faults import FaultStorage
from popflow.flows.simulation.scenarios import Accumulator
from popflow.infra.storage.folder import Storage
from popflow.infra.store import checkpoints as checkpoint_store
from popflow.infra.store.checkpoints import (
    fetch_checkpoint,
    manifest_digest,
    publish_checkpoint,
    read_manifest,
)
from popflow.infra.store.commit_log import ExperimentLog
from popflow.infra.store.layout import (
    checkpoint_name,
    checkpoint_owner,
    checkpoint_path,
    is_checkpoint_name,
    lease_path,
)
from popflow.infra.store.lease import LeaseLost
from popflow.schedulers import PopulationBasedTraining, Trial, uniform
from popflow.tasks import Trainable
from popflow.tasks import segment_run as segment_run_module
from popflow.tasks.progress import VOLATILE_FIELDS
from popflow.tasks.segment import run_segment
from popflow.tasks.specs import SegmentSpec

T = TypeVar("T")

TRIAL = "Counter_t0"


class Counter(Trainable):
    """A dict checkpoint of a count (no files of its own)."""

    def setup(self, config: dict[str, Any]) -> None:
        self.value = config.get("start", 0)

    def step(self) -> dict[str, Any]:
        self.value += 1
        return {"value": self.value}

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {"value": self.value}

    def load_checkpoint(self, checkpoint: dict[str, Any] | str) -> None:
        assert isinstance(checkpoint, dict)
        self.value = checkpoint["value"]


def segment(storage: Storage, epoch: int, start: int) -> SegmentSpec:
    """Two iterations of a trial of driver ``epoch``, checkpointed at the end (iteration 2)."""
    return SegmentSpec(
        trainable=Counter,
        trial_id="t0",
        trial_dir=TRIAL,
        config={"start": start},
        storage=storage,
        seed=0,
        stop={"training_iteration": 2},
        lease_epoch=epoch,
    )


class Interleave:
    """A stale driver's storage hook: at its ``at``-th call, ``meanwhile`` runs first (a
    newer driver, on storage of its own) and the call goes on (a stall); at its
    ``crash_at``-th call (if any, from ``at`` on) it dies, and at every later call."""

    def __init__(self, at: int, meanwhile: Callable[[], None], crash_at: int | None) -> None:
        self.at, self.meanwhile, self.crash_at = at, meanwhile, crash_at
        self.calls: list[str] = []
        self.dead = False

    def call(self, storage: FaultStorage, op: str, path: str, run: Callable[[], T]) -> T:
        if self.dead:
            raise SimulatedCrash("killed before")
        n = len(self.calls)
        self.calls.append(op)
        if n == self.at:
            self.meanwhile()
        if n == self.crash_at:
            self.dead = True
            raise SimulatedCrash(f"killed at call {n} ({op} {path})")
        return run()


class Newer:
    """The driver that took over (epoch ``epoch``): its lease, then its segment publishes
    iteration 2 and it commits that checkpoint (its name and digest, kept here)."""

    def __init__(self, storage: Storage, epoch: int) -> None:
        self.storage, self.epoch = storage, epoch
        self.committed: tuple[str, str] | None = None

    def __call__(self) -> None:
        self.storage.create_text("{}", lease_path(self.epoch))
        out = run_segment(segment(self.storage, self.epoch, start=100))
        assert out.error is None, out.error
        (ckpt,) = out.checkpoints
        assert ckpt.digest is not None
        self.committed = (checkpoint_path(TRIAL, ckpt.name), ckpt.digest)

    def assert_kept(self, tmp: Path) -> None:
        """Its committed checkpoint is there, whole, the version it committed."""
        assert self.committed is not None
        path, digest = self.committed
        assert manifest_digest(read_manifest(self.storage, path)) == digest
        metadata = fetch_checkpoint(self.storage, path, str(tmp))
        assert metadata["result"]["value"] == 102


def each_interleaving(
    tmp: Path,
    prepare: Callable[[Storage, Path], Callable[[Interleave], None]],
    epoch: int,
    store: Callable[[str], Storage] | None = None,
) -> set[str]:
    """Run the stale step that ``prepare`` readies in a fresh experiment for each call it
    makes: the newer driver of ``epoch`` runs there, then the stale one goes on to its end
    or dies at that call or any later one; each time the newer driver's committed
    checkpoint must be kept. ``store``: a fresh experiment's storage by name (default: a
    folder in ``tmp``). Returns the kinds of call the stale steps made."""
    new_store = store or (lambda name: Storage(str(tmp / name)))
    ops: set[str] = set()
    for at in itertools.count():
        made = 0
        crash_at: int | None = None
        while crash_at is None or crash_at < made:
            root = new_store(f"{at}-{crash_at}")
            run = prepare(root, tmp / f"{at}-{crash_at}-src")
            newer = Newer(root, epoch)
            hook = Interleave(at, newer, crash_at)
            run(hook)
            if newer.committed is None:  # the stale step made fewer calls: all were tried
                assert crash_at is None
                return ops
            newer.assert_kept(tmp / f"{at}-{crash_at}-out")
            if crash_at is None:
                made = len(hook.calls)
                ops.update(hook.calls)
                crash_at = at
            else:
                crash_at += 1
    raise AssertionError("unreachable")


# -- names ---------------------------------------------------------------------------


@pytest.mark.unit
def test_a_name_carries_its_drivers_epoch_above_the_first():
    assert checkpoint_name(10, set()) == "checkpoint_000010"
    assert checkpoint_name(10, set(), epoch=1) == "checkpoint_000010"  # Ray's, the first lease
    assert checkpoint_name(10, set(), epoch=3) == "checkpoint_000010_e3"
    assert checkpoint_name(10, {"checkpoint_000010_e3"}, epoch=3) == "checkpoint_000010_e3_1"
    assert checkpoint_name(10, {"checkpoint_000010"}, epoch=3) == "checkpoint_000010_e3"
    owners = {
        "checkpoint_000010": 1,
        "checkpoint_000010_2": 1,
        "checkpoint_000010_e3": 3,
        "checkpoint_000010_e3_2": 3,
        "checkpoint_1234567_e100000000": 100000000,
    }
    for name, owner in owners.items():
        assert is_checkpoint_name(name) and checkpoint_owner(name) == owner, name
    for bad in ("checkpoint_000010_e0", "checkpoint_000010_e03", "checkpoint_000010_e", "x"):
        assert not is_checkpoint_name(bad) and checkpoint_owner(bad) is None, bad


@pytest.mark.unit
def test_a_publish_under_another_epochs_name_is_refused_before_anything_is_written(tmp_path):
    storage = Storage(str(tmp_path / "exp"))
    src = write_tree(tmp_path / "src", {"w.bin": b"w"})
    for name, epoch in (("checkpoint_000002_e3", 2), ("checkpoint_000002", 3)):
        with pytest.raises(ValueError, match="publishes only under its own"):
            publish_checkpoint(storage, str(src), f"{TRIAL}/{name}", {"epoch": epoch})
    assert not (tmp_path / "exp").exists()
    publish_checkpoint(storage, str(src), f"{TRIAL}/checkpoint_000002", {})  # no lease: any


# -- a stale publish -----------------------------------------------------------------


def _stale_publish(root: Storage, scratch: Path) -> Callable[[Interleave], None]:
    def run(hook: Interleave) -> None:
        # driver epoch 1's segment, stopped at a call of its own by the hook
        run_segment(segment(FaultStorage.over(root, hook), 1, start=0))

    return run


@pytest.mark.unit
def test_a_stale_publish_stopped_at_any_call_leaves_the_newer_drivers_checkpoint(tmp_path):
    """searcher/3x3/s2:15=stall,67=crash in small: a publish stopped between its exchange
    and its look at what it swapped out, then killed, left its own version under the
    newer driver's committed name."""
    calls = each_interleaving(tmp_path, _stale_publish, epoch=2)
    assert "rename" in calls


# -- a stale resume's removal of orphans ---------------------------------------------


def _stale_clean_up(root: Storage, scratch: Path) -> Callable[[Interleave], None]:
    """Driver epoch 2 resumes from a commit that names no checkpoint of the trial; the
    checkpoint_000002 epoch 1 published after it is an orphan, which it removes."""
    root.create_text("{}", lease_path(1))
    root.create_text("{}", lease_path(2))
    orphan = write_tree(scratch, {"w": b"1"})
    publish_checkpoint(root, str(orphan), f"{TRIAL}/checkpoint_000002", {"epoch": 1})

    def run(hook: Interleave) -> None:
        record = TrialRecord(trial=Trial(trial_id="t0", config={}), index=0, dirname=TRIAL)
        stale = FaultStorage.over(root, hook)
        with contextlib.suppress(SimulatedCrash, LeaseLost):
            remove_uncommitted(stale, [record], epoch=2)

    return run


@pytest.mark.unit
def test_a_stale_resume_stopped_at_any_call_of_its_clean_up_keeps_the_newer_checkpoint(
    tmp_path,
):
    """pbt/3x4/s2:15=stall,40=stall,128=crash in small: a resume stopped between moving
    an orphan aside and moving it back (the newer driver had published its own under the
    orphan's name meanwhile), then killed, lost the newer driver's committed checkpoint."""
    calls = each_interleaving(tmp_path, _stale_clean_up, epoch=3)
    assert "remove" in calls


@pytest.mark.integration
@pytest.mark.parametrize("step", ["publish", "clean_up"])
def test_on_s3_a_stale_step_stopped_at_any_call_keeps_the_newer_checkpoint(s3, tmp_path, step):
    """The same on moto's S3 server, where a publish is a PUT of each file and of the
    manifest last, with no read first: a stale driver stopped after its fence check put
    its manifest over the newer driver's (same name), and a stale resume's look at an
    orphan's manifest, then its DELETE, deleted one published between the two."""
    prepare, epoch = (_stale_publish, 2) if step == "publish" else (_stale_clean_up, 3)
    calls = each_interleaving(tmp_path, prepare, epoch, store=s3.child)
    assert ("create" if step == "publish" else "remove") in calls


@pytest.mark.unit
def test_a_resume_removes_its_own_and_older_orphans_and_no_newer_ones(tmp_path, caplog):
    """Without reading a manifest: the names say whose they are. A newer epoch's name with
    a newer lease stops the driver (LeaseLost); with none (made by hand) it is left, with a
    warning, and the experiment opens."""
    root = Storage(str(tmp_path / "exp"))
    src = write_tree(tmp_path / "src", {"w": b"1"})
    for name, epoch in (
        ("checkpoint_000002", 1),
        ("checkpoint_000002_e2", 2),
        ("checkpoint_000004_e5", 5),
    ):
        publish_checkpoint(root, str(src), f"{TRIAL}/{name}", {"epoch": epoch})
    record = TrialRecord(trial=Trial(trial_id="t0", config={}), index=0, dirname=TRIAL)
    remove_uncommitted(root, [record], epoch=2)
    assert root.listdir(TRIAL) == ["checkpoint_000004_e5"]
    assert "driver epoch 5, but no lease above" in caplog.text
    root.create_text("{}", lease_path(5))
    with pytest.raises(LeaseLost, match="published by driver epoch 5"):
        remove_uncommitted(root, [record], epoch=2)
    assert root.listdir(TRIAL) == ["checkpoint_000004_e5"]


# -- experiments of the release before: plain names by any epoch ---------------------


def _pbt() -> PopulationBasedTraining:
    return PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=2,
        hyperparam_mutations={"a": uniform(0.0, 10.0)},
        synch=True,
        metric="score",
        mode="max",
    )


def _simulate(storage: Storage, resume: bool = False) -> popflow.Simulation:
    return popflow.simulate(
        Accumulator,
        {"a": uniform(0.0, 10.0)},
        scheduler=_pbt(),
        num_samples=3,
        stop={"training_iteration": 6},
        slots=2,
        storage=storage,
        name="exp",
        seed=3,
        resume=resume,
    )


class CrashAtCommit:
    """Kills the driver at its ``nth`` commit, before it is written."""

    def __init__(self, nth: int) -> None:
        self.nth, self.commits = nth, 0

    def call(self, storage: FaultStorage, op: str, path: str, run: Callable[[], T]) -> T:
        if op == "create" and "/.popflow/commits/" in path:
            self.commits += 1
            if self.commits == self.nth:
                raise SimulatedCrash(f"killed at commit {self.nth}")
        return run()


def _results(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Each trial's results, without the fields that differ between identical runs."""
    return {
        p.parent.name: [
            {k: v for k, v in json.loads(line).items() if k not in VOLATILE_FIELDS}
            for line in p.read_text().splitlines()
        ]
        for p in sorted(folder.glob("*/result.json"))
    }


@pytest.mark.unit
def test_an_experiment_whose_plain_names_a_later_epoch_published_resumes(tmp_path, monkeypatch):
    """Before this release every driver published plain names (checkpoint_000004 by epoch
    2, after a takeover). Such an experiment, resumed now (epoch 3), restores from them,
    removes their orphans (a plain name is an older epoch's) and ends as an undisturbed
    run; its own checkpoints carry _e3."""
    _simulate(Storage(str(tmp_path / "calm")))
    old = Storage(str(tmp_path / "old"))
    with pytest.raises(SimulatedCrash):
        _simulate(FaultStorage.over(old, CrashAtCommit(2)))
    with monkeypatch.context() as before:  # the release before: the epoch in no name
        before.setattr(
            segment_run_module,
            "checkpoint_name",
            lambda iteration, taken, epoch=0, attempt=1: checkpoint_name(iteration, taken),
        )
        before.setattr(checkpoint_store, "_check_owner", lambda *args: None)
        with pytest.raises(SimulatedCrash):
            _simulate(FaultStorage.over(old, CrashAtCommit(3)), resume=True)
    exp = old.child("exp")
    latest = ExperimentLog(exp).latest()
    assert latest is not None and latest["epoch"] == 2
    by_epoch_2 = [
        f"{t['dirname']}/{c['name']}"
        for t in latest["trials"]
        for c in t["checkpoints"]
        if read_manifest(exp, f"{t['dirname']}/{c['name']}")["metadata"]["epoch"] == 2
    ]
    assert by_epoch_2 and all(checkpoint_owner(p.split("/")[1]) == 1 for p in by_epoch_2)
    resumed = _simulate(old, resume=True)
    assert {r.metrics["training_iteration"] for r in resumed.grid} == {6}
    assert _results(tmp_path / "old" / "exp") == _results(tmp_path / "calm" / "exp")
    final = ExperimentLog(exp).latest()
    assert final is not None and final["epoch"] == 3
    names = {c["name"] for t in final["trials"] for c in t["checkpoints"]}
    assert any(name.endswith("_e3") for name in names)
    for t in final["trials"]:  # the old run's orphans went: every checkpoint is committed
        on_disk = {n for n in exp.listdir(t["dirname"]) if is_checkpoint_name(n)}
        assert on_disk <= {c["name"] for c in t["checkpoints"]}, t["dirname"]
