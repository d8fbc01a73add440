"""Issue 46, Break A: a segment re-dispatched in the same driver epoch publishes under
names of its own attempt, and a stale attempt's late publish never touches what the
driver committed (popflow.flows.driver.attempts, layout.checkpoint_name)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from popflow.flows.driver.attempts import Attempts
from popflow.flows.experiment.trial_table import is_finished
from popflow.flows.simulation.explore import BESIDE, BESIDE_TEXT
from popflow.flows.simulation.faults import Schedule
from popflow.flows.simulation.invariants import kept
from popflow.flows.simulation.scenarios import LEASE_TTL, NAME, spec_for
from popflow.flows.simulation.world import World
from popflow.infra.storage.folder import Storage
from popflow.infra.store.checkpoints import manifest_digest, read_manifest
from popflow.infra.store.commit_log import ExperimentLog
from popflow.infra.store.layout import (
    checkpoint_attempt,
    checkpoint_name,
    checkpoint_owner,
    is_checkpoint_name,
)
from popflow.tasks.specs import EndReason, SegmentOutcome

pytestmark = pytest.mark.unit


def test_an_attempt_above_the_first_is_in_the_name_and_reads_back():
    assert checkpoint_name(10, set(), epoch=3) == "checkpoint_000010_e3"  # as before
    assert checkpoint_name(10, set(), epoch=3, attempt=1) == "checkpoint_000010_e3"
    assert checkpoint_name(10, set(), epoch=3, attempt=2) == "checkpoint_000010_e3_a2"
    assert checkpoint_name(10, set(), epoch=1, attempt=2) == "checkpoint_000010_a2"
    assert checkpoint_name(10, set(), attempt=12) == "checkpoint_000010_a12"
    taken = {"checkpoint_000010_e3_a2"}  # a restarted lineage's _k after it
    assert checkpoint_name(10, taken, epoch=3, attempt=2) == "checkpoint_000010_e3_a2_1"
    for name, owner, attempt in [
        ("checkpoint_000010", 1, 1),
        ("checkpoint_000010_1", 1, 1),
        ("checkpoint_000010_a2", 1, 2),
        ("checkpoint_000010_e3_a2", 3, 2),
        ("checkpoint_000010_e3_a2_1", 3, 2),
        ("checkpoint_000010_a10_3", 1, 10),
    ]:
        assert is_checkpoint_name(name), name
        assert (checkpoint_owner(name), checkpoint_attempt(name)) == (owner, attempt), name
    for bad in [
        "checkpoint_000010_a1",  # attempt 1 is the plain name
        "checkpoint_000010_a0",
        "checkpoint_000010_a02",
        "checkpoint_000010_a2_e3",  # the epoch comes first
        "checkpoint_000010_1_a2",  # the lineage's _k comes last
        "checkpoint_000010_a",
    ]:
        assert not is_checkpoint_name(bad) and checkpoint_attempt(bad) is None, bad
    for attempt in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="segment attempt"):
            checkpoint_name(10, set(), attempt=attempt)  # type: ignore[arg-type]


def _back(trial_id: str, reason: EndReason = EndReason.MILESTONE, lost: bool = False):
    return SegmentOutcome(trial_id=trial_id, reason=reason, lost_worker=lost)


def test_a_trial_starts_a_new_attempt_only_after_a_dispatch_it_did_not_see_return():
    attempts = Attempts()
    assert attempts.dispatch("a") == 1
    attempts.returned(_back("a"))  # its worker answered: every name it wrote is known
    assert attempts.dispatch("a") == 1
    # returned, not seen: a lost worker (no outcome at all), then the retry
    assert attempts.dispatch("a") == 2
    attempts.returned(_back("a"))
    assert attempts.dispatch("a") == 2  # it stays on its attempt
    attempts.returned(_back("a", EndReason.ERROR))
    assert attempts.dispatch("a") == 3  # an error: what it published may not all be known
    attempts.returned(_back("a", lost=True))
    assert attempts.dispatch("a") == 4
    attempts.returned(_back("a"))
    assert attempts.dispatch("b") == 1  # each trial its own
    attempts.returned(_back("b"))
    attempts.reopen_all()  # a lost round: its publishes were never settled
    assert (attempts.dispatch("a"), attempts.dispatch("b"), attempts.dispatch("c")) == (5, 2, 1)


def test_a_stale_attempts_late_publish_never_touches_the_committed_checkpoint():
    """A segment call stalls on its worker (SIGSTOP); the driver's backend declares the
    worker dead and the driver runs the segments again and commits them; then the stale
    call wakes and publishes what it trained, in the same driver epoch. It once published
    the same names: on local disk its version was swapped in under the committed name
    (the commit's digest no longer matched; a restore loaded it silently). Now the new
    attempt's names carry ``_a2`` and the stale one's stay its own: the committed
    checkpoints are the versions the commit names, and the stale ones are no commit's."""
    schedule = Schedule.parse("pbt/3x4/s2:30=stall_segment")
    with tempfile.TemporaryDirectory(prefix="popflow-attempts-") as folder:
        root = Storage(os.path.join(folder, "store"))
        root.write_text(BESIDE_TEXT, *BESIDE)
        scenario = schedule.scenario
        world = World(schedule, root, lambda s: spec_for(scenario, s), NAME, LEASE_TTL)
        experiment = world.experiment

        def finished() -> bool:
            latest = ExperimentLog(experiment).latest()
            return latest is not None and is_finished(latest)

        world.run(finished)
        assert [f.value for _, f in world.fired] == ["stall_segment"]
        latest = ExperimentLog(experiment).latest()
        assert latest is not None
        committed = {
            f"{t['dirname']}/{c['name']}": c["digest"]
            for t in latest["trials"]
            for c in t["checkpoints"]
        }
        for path, digest in committed.items():  # the versions the commit names, still
            assert manifest_digest(read_manifest(experiment, path)) == digest, path
        assert kept(experiment) == []
        again = sorted(p for p in committed if checkpoint_attempt(p.split("/")[1]) == 2)
        assert again, committed  # the re-dispatched segments' names carry their attempt
        stale = sorted(
            f"{d.name}/{c.name}"
            for d in Path(experiment.root).iterdir()
            if d.is_dir()
            for c in d.iterdir()
            if is_checkpoint_name(c.name) and f"{d.name}/{c.name}" not in committed
        )
        # the stale attempt published the same iterations, under its own names
        assert stale and {p.replace("_a2", "") for p in again} <= set(stale)
