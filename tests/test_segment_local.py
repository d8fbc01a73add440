"""tasks.segment.run_segment in-process (no Dask, no Prefect) with small trainables."""

from __future__ import annotations

import errno
import os
import random
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from popflow.infra.storage.folder import Storage
from popflow.infra.store.checkpoints import read_manifest
from popflow.infra.store.layout import DICT_CHECKPOINT_FILE, checkpoint_name
from popflow.tasks import Checkpoint, Trainable, get_checkpoint, report
from popflow.tasks.segment import run_segment
from popflow.tasks.segment_run import should_stop
from popflow.tasks.specs import SegmentOutcome, SegmentSpec

pytestmark = pytest.mark.unit

TRIAL_DIR = "Counter_t0"

# -- trainables ------------------------------------------------------------------


class Counter(Trainable):
    """``value`` grows by ``config["inc"]`` per step; a dict checkpoint."""

    loaded: list[Any] = []  # what load_checkpoint received, per class

    def setup(self, config: dict[str, Any]) -> None:
        self.value = 0.0
        self.inc = config.get("inc", 1.0)

    def step(self) -> dict[str, Any]:
        self.value += self.inc
        result: dict[str, Any] = {"value": self.value, "seen_iteration": self.iteration}
        if self.config.get("done_at") == self.iteration + 1:
            result["done"] = True
        if self.config.get("fail_at") == self.iteration + 1:
            raise RuntimeError(f"boom at {self.iteration + 1}")
        return result

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {"value": self.value}

    def load_checkpoint(self, checkpoint: dict[str, Any] | str) -> None:
        type(self).loaded.append(checkpoint)
        assert isinstance(checkpoint, dict)
        self.value = checkpoint["value"]


class DirCounter(Counter):
    """The same, checkpointing into files."""

    loaded: list[Any] = []
    cleaned: list[str] = []  # trials whose trainable was discarded (cleanup ran)

    def cleanup(self) -> None:
        type(self).cleaned.append(self.trial_id)

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        os.makedirs(os.path.join(checkpoint_dir, "sub"))
        with open(os.path.join(checkpoint_dir, "sub", "value.txt"), "w") as f:
            f.write(repr(self.value))

    def load_checkpoint(self, checkpoint: dict[str, Any] | str) -> None:
        type(self).loaded.append(checkpoint)
        assert isinstance(checkpoint, str)
        with open(os.path.join(checkpoint, "sub", "value.txt")) as f:
            self.value = float(f.read())


class Draws(Trainable):
    def step(self) -> dict[str, Any]:
        return {"py": random.random(), "np": float(np.random.rand())}


class NotADict(Trainable):
    def step(self) -> Any:
        return [1.0]


def counting_function(config: dict[str, Any]) -> None:
    """Function API twin of :class:`Counter`, with a folder checkpoint at every report."""
    value, start = 0.0, 0
    ckpt = get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d, open(os.path.join(d, "state.txt")) as f:
            start_s, value_s = f.read().split()
            start, value = int(start_s), float(value_s)
    for i in range(start, config.get("n", 1000)):
        value += config.get("inc", 1.0)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.txt"), "w") as f:
                f.write(f"{i + 1} {value}")
            report(
                {"value": value, "restored": ckpt is not None},
                checkpoint=Checkpoint.from_directory(d),
            )


# -- helpers ---------------------------------------------------------------------


@pytest.fixture
def storage(tmp_path) -> Storage:
    return Storage(str(tmp_path / "store"))


@pytest.fixture
def run() -> Iterator[Any]:
    """``run(spec)``: run_segment, then discard whatever the segment parked on this process."""
    tokens: list[str] = []

    def _run(spec: SegmentSpec) -> SegmentOutcome:
        outcome = run_segment(spec)
        if outcome.live_token:
            tokens.append(outcome.live_token)
        return outcome

    yield _run
    from popflow.tasks.live import discard_parked

    assert discard_parked(tokens) == len(tokens)  # every parked trainable was still there


def spec(storage: Storage, trainable: Any = Counter, **kwargs: Any) -> SegmentSpec:
    args: dict[str, Any] = {
        "trainable": trainable,
        "trial_id": "t0",
        "trial_dir": TRIAL_DIR,
        "config": {},
        "storage": storage,
        "seed": 0,
    }
    args.update(kwargs)
    return SegmentSpec(**args)


def column(outcome: SegmentOutcome, key: str) -> list[Any]:
    return [r[key] for r in outcome.results]


def ok(outcome: SegmentOutcome) -> SegmentOutcome:
    assert outcome.error is None, outcome.error
    return outcome


# -- how a segment ends ----------------------------------------------------------


def test_milestone_on_training_iteration(storage, run):
    out = ok(run(spec(storage, time_attr="training_iteration", target=3)))
    assert out.reason == "milestone"
    assert column(out, "training_iteration") == [1, 2, 3]
    assert column(out, "value") == [1.0, 2.0, 3.0]
    # the trial continues later from here, so the milestone is checkpointed
    assert [(c.name, c.iteration) for c in out.checkpoints] == [("checkpoint_000003", 3)]
    assert out.checkpoints[0].result["value"] == 3.0


def test_milestone_on_a_custom_time_attr(storage, run):
    out = ok(run(spec(storage, config={"inc": 2.0}, time_attr="value", target=5)))
    assert out.reason == "milestone"
    assert column(out, "value") == [2.0, 4.0, 6.0]  # ends at the first result >= target


def test_max_iterations(storage, run):
    out = ok(run(spec(storage, max_iterations=4)))
    assert out.reason == "max_iterations"
    assert len(out.results) == 4
    assert [c.iteration for c in out.checkpoints] == [4]


def test_stop_dict_uses_greater_or_equal(storage, run):
    out = ok(run(spec(storage, stop={"value": 3.0}, max_iterations=100)))
    assert out.reason == "stop"
    assert column(out, "value") == [1.0, 2.0, 3.0]
    assert [c.iteration for c in out.checkpoints] == [3]  # checkpoint_at_end


def test_stop_any_key_of_the_dict(storage, run):
    out = ok(run(spec(storage, stop={"value": 100.0, "training_iteration": 2})))
    assert out.reason == "stop"
    assert len(out.results) == 2


def test_stop_without_checkpoint_at_end(storage, run):
    out = ok(run(spec(storage, stop={"training_iteration": 2}, checkpoint_at_end=False)))
    assert out.reason == "stop"
    assert out.checkpoints == []
    assert storage.listdir(TRIAL_DIR) == []


def test_stop_key_missing_from_the_result_is_an_error_naming_the_key(storage, run):
    out = run(spec(storage, stop={"mean_accuracy": 0.9}, max_iterations=5))
    assert out.reason == "error"
    assert "stop condition key 'mean_accuracy' is not in the trial's result" in out.error
    assert len(out.results) == 1


def test_stop_callable_gets_trial_id_and_result(storage, run):
    calls: list[tuple[str, int]] = []

    def stopper(trial_id: str, result: dict[str, Any]) -> bool:
        calls.append((trial_id, result["training_iteration"]))
        return result["value"] >= 2

    out = ok(run(spec(storage, stop=stopper, max_iterations=10)))
    assert out.reason == "stop"
    assert calls == [("t0", 1), ("t0", 2)]


def test_should_stop_unit():
    assert not should_stop(None, "t", {"a": 1})
    assert should_stop({"a": 1}, "t", {"a": 1})
    assert not should_stop({"a": 2}, "t", {"a": 1})
    with pytest.raises(ValueError, match=r"stop condition key 'b' .*result keys are \['a'\]"):
        should_stop({"b": 1}, "t", {"a": 1})


def test_done_ends_the_segment_and_checkpoints(storage, run):
    out = ok(run(spec(storage, config={"done_at": 2}, max_iterations=10)))
    assert out.reason == "done"
    assert column(out, "done") == [False, True]
    assert [c.iteration for c in out.checkpoints] == [2]


def test_done_beats_a_milestone_reached_at_the_same_iteration(storage, run):
    out = ok(run(spec(storage, config={"done_at": 2}, time_attr="training_iteration", target=2)))
    assert out.reason == "done"


def test_milestone_on_a_time_attr_missing_from_the_result_is_an_error(storage, run):
    out = run(spec(storage, time_attr="epoch", target=2, max_iterations=5))
    assert out.reason == "error"
    assert "epoch" in out.error


# -- checkpoints -----------------------------------------------------------------


def test_checkpoint_frequency(storage, run):
    out = ok(run(spec(storage, checkpoint_frequency=2, max_iterations=5)))
    assert [c.name for c in out.checkpoints] == [
        "checkpoint_000002",
        "checkpoint_000004",
        "checkpoint_000005",  # the end of the segment
    ]
    assert storage.listdir(TRIAL_DIR) == [c.name for c in out.checkpoints]
    meta = read_manifest(storage, f"{TRIAL_DIR}/checkpoint_000004")["metadata"]
    assert meta["iteration"] == 4
    assert meta["result"]["value"] == 4.0


def test_checkpoint_name_suffixes_when_taken():
    assert checkpoint_name(10, set()) == "checkpoint_000010"
    assert checkpoint_name(10, {"checkpoint_000010"}) == "checkpoint_000010_1"
    assert (
        checkpoint_name(10, {"checkpoint_000010", "checkpoint_000010_1"}) == "checkpoint_000010_2"
    )
    assert checkpoint_name(10, {"checkpoint_000011"}) == "checkpoint_000010"


def test_segment_does_not_overwrite_taken_checkpoints(storage, run):
    out = ok(run(spec(storage, max_iterations=2, taken=frozenset({"checkpoint_000002"}))))
    assert [c.name for c in out.checkpoints] == ["checkpoint_000002_1"]
    assert storage.exists(TRIAL_DIR, "checkpoint_000002_1")


@pytest.mark.parametrize("cls", [Counter, DirCounter])
def test_restore_continues_state_and_iteration_counting(storage, run, cls):
    cls.loaded.clear()
    first = ok(run(spec(storage, cls, config={"inc": 0.5}, max_iterations=3)))
    restore = f"{TRIAL_DIR}/{first.checkpoints[-1].name}"
    second = ok(run(spec(storage, cls, config={"inc": 0.5}, restore=restore, max_iterations=2)))
    assert second.reason == "max_iterations"
    assert column(second, "training_iteration") == [4, 5]
    assert column(second, "seen_iteration") == [3, 4]  # Trainable.iteration counts on too
    assert column(second, "iterations_since_restore") == [1, 2]
    assert column(second, "value") == [2.0, 2.5]
    assert second.checkpoints[-1].name == "checkpoint_000005"
    assert second.results[0]["time_total_s"] >= first.results[-1]["time_total_s"]
    assert len(cls.loaded) == 1


def test_on_local_disk_checkpoints_are_saved_and_loaded_where_they_live(storage, run, monkeypatch):
    """A class trainable saves into a folder beside its checkpoints, published by a rename,
    and loads its checkpoint where it is, verified first: no temporary folder, no copy
    (a 256-member PBT round paid both per member). A function trainable, which may read
    its checkpoint lazily, still gets a copy of its own."""
    import tempfile

    made: list[str] = []
    original = tempfile.mkdtemp

    def mkdtemp(*args: Any, **kwargs: Any) -> str:
        folder = original(*args, **kwargs)
        made.append(folder)
        return folder

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    DirCounter.loaded.clear()
    first = ok(run(spec(storage, DirCounter, max_iterations=2)))
    restore = f"{TRIAL_DIR}/{first.checkpoints[-1].name}"
    ok(run(spec(storage, DirCounter, restore=restore, max_iterations=1)))
    assert made == []
    assert DirCounter.loaded == [storage.path(restore)]  # the checkpoint itself
    assert [n for n in storage.listdir(TRIAL_DIR) if ".tmp-" in n] == []  # no staging left
    with open(storage.path(restore, "sub", "value.txt"), "w") as f:
        f.write("tampered")
    bad = run(spec(storage, DirCounter, restore=restore, max_iterations=1))
    assert bad.bad_checkpoint == restore and "fails its check" in bad.error
    fn_store = storage.child("fn")  # a trial of its own: publishes never replace a name
    fn = ok(run(spec(fn_store, counting_function, max_iterations=1)))
    restore = f"{TRIAL_DIR}/{fn.checkpoints[-1].name}"
    ok(run(spec(fn_store, counting_function, restore=restore, max_iterations=1)))
    assert any("popflow-restore-" in m for m in made)


class FillsTheDisk(Counter):
    def save_checkpoint(self, checkpoint_dir: str) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", checkpoint_dir)


def test_a_full_disk_while_a_checkpoint_is_saved_in_place_is_storages_failure(storage, run):
    """The trainable writes its checkpoint into storage itself: a full disk there stops
    the run (a StorageError), it does not error the trial."""
    out = run(spec(storage, FillsTheDisk, max_iterations=1, checkpoint_frequency=1))
    assert out.reason == "error"
    assert out.storage_failure is not None and out.storage_failure.errno == errno.ENOSPC
    assert [n for n in storage.listdir(TRIAL_DIR) if ".tmp-" in n] == []


def test_dict_checkpoint_vs_directory_checkpoint(storage, tmp_path, run):
    Counter.loaded.clear()
    DirCounter.loaded.clear()
    dict_store, dir_store = storage.child("dict"), storage.child("dir")
    ok(run(spec(dict_store, Counter, max_iterations=1)))
    ok(run(spec(dir_store, DirCounter, max_iterations=1)))
    ckpt = f"{TRIAL_DIR}/checkpoint_000001"
    assert sorted(read_manifest(dict_store, ckpt)["files"]) == [DICT_CHECKPOINT_FILE]
    assert sorted(read_manifest(dir_store, ckpt)["files"]) == ["sub/value.txt"]
    assert Checkpoint(dict_store.path(ckpt)).to_dict() == {"value": 1.0}
    ok(run(spec(dict_store, Counter, restore=ckpt, max_iterations=1)))
    ok(run(spec(dir_store, DirCounter, restore=ckpt, max_iterations=1)))
    assert Counter.loaded == [{"value": 1.0}]
    assert len(DirCounter.loaded) == 1
    assert isinstance(DirCounter.loaded[0], str)


class WeightsAndNotes(Counter):
    """A dict checkpoint with a large array (pickled in frames and out-of-band buffers),
    and a file of its own beside it."""

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        with open(os.path.join(checkpoint_dir, "notes.txt"), "w") as f:
            f.write(f"value {self.value}")
        return {"value": self.value, "weights": np.arange(300_000, dtype=np.float64)}

    def load_checkpoint(self, checkpoint: dict[str, Any] | str) -> None:
        assert isinstance(checkpoint, dict)
        assert np.array_equal(checkpoint["weights"], np.arange(300_000, dtype=np.float64))
        self.value = checkpoint["value"]


def test_a_dict_checkpoint_is_not_read_back_to_take_its_digest(storage, run, monkeypatch):
    """popflow takes the manifest entry of the dict it pickles as it writes it; only the
    files the trainable wrote itself are read for their digest. The manifest still holds
    every file's true size and SHA-256, so the checkpoint restores verified."""
    import hashlib

    from popflow.infra.store import checkpoints as checkpoint_store

    digested: list[str] = []
    original = checkpoint_store._digest

    def digest(path: str) -> str:
        digested.append(os.path.basename(path))
        return original(path)

    monkeypatch.setattr(checkpoint_store, "_digest", digest)
    out = ok(run(spec(storage, WeightsAndNotes, max_iterations=1, checkpoint_frequency=1)))
    assert digested == ["notes.txt"]
    ckpt = f"{TRIAL_DIR}/{out.checkpoints[-1].name}"
    files = read_manifest(storage, ckpt)["files"]
    assert sorted(files) == [DICT_CHECKPOINT_FILE, "notes.txt"]
    for rel, entry in files.items():
        with open(storage.path(ckpt, rel), "rb") as f:
            data = f.read()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert len(data) > 0 and files[DICT_CHECKPOINT_FILE]["size"] > 2_400_000
    again = ok(run(spec(storage, WeightsAndNotes, restore=ckpt, max_iterations=1)))
    assert again.results[-1]["value"] == 2.0


def test_restore_from_a_missing_checkpoint_is_an_error(storage, run):
    out = run(spec(storage, restore=f"{TRIAL_DIR}/checkpoint_000009", max_iterations=1))
    assert out.reason == "error"
    assert "CheckpointError" in out.error
    assert "checkpoint_000009 has no manifest" in out.error
    assert out.results == []


# -- errors ----------------------------------------------------------------------


def test_trainable_raising_is_an_error_with_traceback_and_results_so_far(storage, run):
    out = run(spec(storage, config={"fail_at": 3}, max_iterations=10))
    assert out.reason == "error"
    assert "Traceback" in out.error
    assert "RuntimeError: boom at 3" in out.error
    assert column(out, "value") == [1.0, 2.0]


def test_step_returning_a_non_dict_is_an_error(storage, run):
    out = run(spec(storage, NotADict, max_iterations=3))
    assert out.reason == "error"
    assert "TypeError" in out.error
    assert "NotADict.step() must return a dict, got [1.0]" in out.error
    assert out.results == []


# -- function API ----------------------------------------------------------------


def test_report_and_get_checkpoint_outside_a_session_raise():
    with pytest.raises(RuntimeError, match=r"report\(\) and get_checkpoint\(\) only work inside"):
        report({"x": 1})
    with pytest.raises(RuntimeError, match="only work inside a function trainable"):
        get_checkpoint()
    with pytest.raises(TypeError, match="report\\(\\) takes a dict of metrics, got list"):
        report([1])  # type: ignore[arg-type]


def test_function_returning_is_finished(storage, run):
    out = ok(run(spec(storage, counting_function, config={"n": 3}, max_iterations=10)))
    assert out.reason == "finished"
    assert column(out, "training_iteration") == [1, 2, 3]
    assert [c.name for c in out.checkpoints] == [f"checkpoint_00000{i}" for i in (1, 2, 3)]


def test_function_without_reports_is_finished(storage, run):
    out = ok(run(spec(storage, lambda config: None, max_iterations=10)))
    assert out.reason == "finished"
    assert out.results == []


@pytest.mark.parametrize(
    "end, reason",
    [
        ({"max_iterations": 3}, "max_iterations"),
        ({"stop": {"training_iteration": 3}}, "stop"),
        ({"time_attr": "value", "target": 3}, "milestone"),
    ],
)
def test_function_segment_end(storage, run, end, reason):
    out = ok(run(spec(storage, counting_function, **end)))
    assert out.reason == reason
    assert column(out, "value") == [1.0, 2.0, 3.0]


def test_function_restore_hands_over_the_checkpoint(storage, run):
    first = ok(run(spec(storage, counting_function, config={"inc": 2.0}, max_iterations=2)))
    restore = f"{TRIAL_DIR}/{first.checkpoints[-1].name}"
    second = ok(
        run(
            spec(storage, counting_function, config={"inc": 2.0}, restore=restore, max_iterations=2)
        )
    )
    assert column(second, "restored") == [True, True]
    assert column(second, "training_iteration") == [3, 4]
    assert column(second, "value") == [6.0, 8.0]


def test_except_exception_in_user_code_does_not_swallow_the_segment_end(storage, run):
    events: list[str] = []

    def stubborn(config: dict[str, Any]) -> None:
        try:
            for i in range(50):
                try:
                    report({"i": i})
                except Exception:
                    events.append("swallowed")
                events.append("after report")
        finally:
            events.append("unwound")

    out = ok(run(spec(storage, stubborn, stop={"training_iteration": 3})))
    assert out.reason == "stop"
    assert len(out.results) == 3  # nothing reported after the end
    assert events == ["after report", "after report", "unwound"]


def test_report_errors_are_not_swallowed_by_except_exception(storage, run):
    swallowed: list[str] = []

    def swallowing(config: dict[str, Any]) -> None:
        for i in range(20):
            try:
                report({"i": i})
            except Exception as e:
                swallowed.append(repr(e))

    out = run(spec(storage, swallowing, stop={"mean_accuracy": 1.0}))
    assert out.reason == "error"
    assert "stop condition key 'mean_accuracy'" in out.error
    assert len(out.results) == 1
    assert swallowed == []


def test_function_raising_is_an_error_with_results_so_far(storage, run):
    def failing(config: dict[str, Any]) -> None:
        report({"x": 1})
        raise KeyError("missing-thing")

    out = run(spec(storage, failing, max_iterations=5))
    assert out.reason == "error"
    assert "KeyError: 'missing-thing'" in out.error
    assert column(out, "x") == [1]


# -- seeding ---------------------------------------------------------------------


@pytest.mark.parametrize("trainable", ["class", "function"])
def test_same_seed_gives_the_same_draws(storage, run, trainable):
    def draws_fn(config: dict[str, Any]) -> None:
        while True:
            report({"py": random.random(), "np": float(np.random.rand())})

    t = Draws if trainable == "class" else draws_fn

    def draws(seed: int) -> list[tuple[float, float]]:
        random.seed(12345)  # whatever the process did before must not matter
        np.random.seed(54321)
        out = ok(
            run(
                spec(storage, t, seed=seed, stop={"training_iteration": 3}, checkpoint_at_end=False)
            )
        )
        return list(zip(column(out, "py"), column(out, "np"), strict=True))

    first = draws(7)
    random.random()
    np.random.rand()
    assert draws(7) == first
    assert draws(8) != first
    assert len(set(first)) == 3
