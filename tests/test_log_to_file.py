"""``RunConfig(log_to_file=...)`` (issue 44, item 8): a trial's stdout and stderr also go to
files in its folder, as Ray's (``True``: ``stdout``/``stderr``; a name: one file; a pair:
two), appended across segments and restores, on local disk and on S3."""

from __future__ import annotations

import os
import posixpath
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from support.polling import wait_for

import popflow
from popflow import tune
from popflow.infra.storage.folder import Storage
from popflow.tasks import Checkpoint, Trainable, get_checkpoint, report, trial_output
from popflow.tasks.live import discard_parked
from popflow.tasks.segment import run_segment
from popflow.tasks.specs import SegmentOutcome, SegmentSpec
from popflow.tasks.trial_output import log_files

TRIAL_DIR = "out_t0"

# -- trainables ------------------------------------------------------------------


class Talks(Trainable):
    def setup(self, config: dict[str, Any]) -> None:
        print("setup")

    def step(self) -> dict[str, Any]:
        print(f"out {self.iteration + 1}")
        print(f"err {self.iteration + 1}", file=sys.stderr)
        return {"x": 1}

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        return {}

    def load_checkpoint(self, checkpoint: Any) -> None:
        print("restored")


def talking_function(config: dict[str, Any]) -> None:
    """Prints in its own thread; a checkpoint at every report, resumed from."""
    start = 0
    if (ckpt := get_checkpoint()) is not None:
        with ckpt.as_directory() as d, open(os.path.join(d, "i")) as f:
            start = int(f.read())
        print(f"resumed at {start}")
    for i in range(start, config.get("n", 100)):
        print(f"fn {i + 1}")
        sys.stderr.write(f"fn err {i + 1}\n")
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "i"), "w") as f:
                f.write(str(i + 1))
            report({"i": i + 1}, checkpoint=Checkpoint(d))


# -- helpers ---------------------------------------------------------------------


@pytest.fixture
def storage(tmp_path) -> Storage:
    return Storage(str(tmp_path / "store"))


@pytest.fixture
def run() -> Iterator[Any]:
    tokens: list[str] = []

    def _run(spec: SegmentSpec) -> SegmentOutcome:
        outcome = run_segment(spec)
        assert outcome.error is None, outcome.error
        if outcome.live_token:
            tokens.append(outcome.live_token)
        return outcome

    yield _run
    discard_parked(tokens)


def spec(storage: Storage, trainable: Any, **kwargs: Any) -> SegmentSpec:
    args: dict[str, Any] = {
        "trainable": trainable,
        "trial_id": "t0",
        "trial_dir": TRIAL_DIR,
        "config": {},
        "storage": storage,
        "seed": 0,
        "log_to_file": True,
        "max_iterations": 2,
    }
    args.update(kwargs)
    return SegmentSpec(**args)


def lines(storage: Storage, name: str) -> list[str]:
    return storage.read_text(TRIAL_DIR, name).splitlines()


# -- what log_to_file names ------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    "given, names",
    [
        (False, (None, None)),
        (None, (None, None)),
        (True, ("stdout", "stderr")),
        ("output.log", ("output.log", "output.log")),
        (("o.txt", "e.txt"), ("o.txt", "e.txt")),
        (["logs/o", None], ("logs/o", None)),
    ],
)
def test_log_to_file_names_rays_files(given, names):
    assert log_files(given) == names
    tune.RunConfig(log_to_file=given)  # accepted, no longer refused


@pytest.mark.unit
@pytest.mark.parametrize(
    "given, message",
    [
        (("a", "b", "c"), "must hold 2 names"),
        (3, "must be a bool, a file name or a pair"),
        ("/tmp/out", "not a file name in the trial's folder"),
        (("../out", "err"), "not a file name in the trial's folder"),
        ("result.json", "popflow writes 'result.json'"),
        ("checkpoint_000001/x", "popflow writes 'checkpoint_000001'"),
        ((b"o", "e"), "is not a file name"),
    ],
)
def test_a_bad_log_to_file_is_refused_where_the_run_config_is_made(given, message):
    with pytest.raises((TypeError, ValueError), match=message):
        tune.RunConfig(log_to_file=given)


@pytest.mark.unit
def test_a_resume_keeps_log_to_file(tmp_path):
    """``run_args.json`` keeps it (Tuner.restore and ``popflow resume`` run again from it),
    and only when given: an experiment without it stores the same as before."""
    from popflow.flows.spec.groups import StorageSpec
    from popflow.flows.spec.run_args import load_run_args, save_run_args
    from popflow.flows.spec.run_spec import run_spec

    for given, kept in ((("o", "e"), {"log_to_file": ("o", "e")}), (False, {})):
        spec = run_spec(
            prints,
            {"a": 1},
            tune.TuneConfig(),
            tune.RunConfig(name="kept", log_to_file=given),
            StorageSpec(Storage(str(tmp_path))),
        )
        folder = Storage(str(tmp_path / str(bool(given))))
        save_run_args(folder, spec.run_args(0))
        saved = load_run_args(folder)
        assert {k: v for k, v in saved.items() if k == "log_to_file"} == kept
        again = run_spec(
            prints, {"a": 1}, tune.TuneConfig(), tune.RunConfig(name="kept", **kept),
            StorageSpec(Storage(str(tmp_path))),
        )  # fmt: skip
        assert again.log_to_file == given


# -- on a worker -----------------------------------------------------------------


@pytest.mark.unit
def test_a_class_trainables_output_goes_to_its_files_and_on_to_the_console(storage, run, capsys):
    run(spec(storage, Talks))
    assert lines(storage, "stdout") == ["setup", "out 1", "out 2"]
    assert lines(storage, "stderr") == ["err 1", "err 2"]
    shown = capsys.readouterr()  # the worker's own streams still get it (Ray's Tee)
    assert shown.out.splitlines() == ["setup", "out 1", "out 2"]
    assert shown.err.splitlines() == ["err 1", "err 2"]


@pytest.mark.unit
def test_output_is_appended_across_segments_and_restores(storage, run):
    first = run(spec(storage, Talks, checkpoint_at_end=True, checkpoint_frequency=2))
    restore = f"{TRIAL_DIR}/{first.checkpoints[-1].name}"
    run(spec(storage, Talks, restore=restore))  # a new trainable: a restore, a resume
    restarted = ["setup", "restored", "out 3", "out 4"]
    assert lines(storage, "stdout") == ["setup", "out 1", "out 2", *restarted]
    assert lines(storage, "stderr") == ["err 1", "err 2", "err 3", "err 4"]


@pytest.mark.unit
def test_a_function_prints_from_its_own_thread_live_and_after_a_restore(storage, run):
    first = run(spec(storage, talking_function, time_attr="training_iteration", target=1))
    run(spec(storage, talking_function, live_token=first.live_token, max_iterations=1))
    second = run(spec(storage, talking_function, restore=f"{TRIAL_DIR}/checkpoint_000002"))
    assert second.results[-1]["training_iteration"] == 4
    assert lines(storage, "stdout") == ["fn 1", "fn 2", "resumed at 2", "fn 3", "fn 4"]
    assert lines(storage, "stderr") == [f"fn err {i}" for i in (1, 2, 3, 4)]


@pytest.mark.unit
def test_one_name_takes_both_streams_and_a_pair_two(storage, run):
    run(spec(storage, Talks, log_to_file="all.log", max_iterations=1))
    assert lines(storage, "all.log") == ["setup", "out 1", "err 1"]
    other = storage.child("other")
    run(spec(other, Talks, trial_id="t1", log_to_file=("logs/o", None), max_iterations=1))
    assert lines(other, "logs/o") == ["setup", "out 1"]
    assert not other.exists(TRIAL_DIR, "stderr")


@pytest.mark.unit
def test_only_the_trials_own_threads_are_caught_and_the_streams_come_back(storage, run):
    """Another thread of the process (the worker's own) prints while the trial runs:
    not into the trial's file. After the segment sys.stdout is what it was."""
    before = sys.stdout
    printed = threading.Event()

    class Waits(Talks):
        def step(self) -> dict[str, Any]:
            threading.Thread(target=lambda: (print("not the trial's"), printed.set())).start()
            assert printed.wait(10)
            return super().step()

    run(spec(storage, Waits, max_iterations=1))
    assert lines(storage, "stdout") == ["setup", "out 1"]
    assert sys.stdout is before


class Passes:
    """A stream a library swaps in over sys.stdout, passing everything on (and never
    putting the old one back)."""

    def __init__(self, under: Any) -> None:
        self.under = under

    def write(self, text: str) -> int:
        return self.under.write(text)

    def flush(self) -> None:
        self.under.flush()


class SwapsStdout(Talks):
    def setup(self, config: dict[str, Any]) -> None:
        sys.stdout = Passes(sys.stdout)
        super().setup(config)


@pytest.mark.unit
def test_a_stream_swapped_in_over_ours_keeps_each_line_once(storage, run, monkeypatch):
    monkeypatch.setattr(sys, "stdout", sys.stdout)  # put back after the test
    first = run(spec(storage, SwapsStdout, max_iterations=1))
    assert isinstance(sys.stdout, Passes)  # theirs now: left alone
    run(spec(storage, SwapsStdout, live_token=first.live_token, max_iterations=1))
    assert lines(storage, "stdout") == ["setup", "out 1", "out 2"]


@pytest.mark.unit
def test_without_log_to_file_nothing_is_written(storage, run):
    run(spec(storage, Talks, log_to_file=False))
    assert sorted(n for n in storage.listdir(TRIAL_DIR) if "std" in n) == []


@pytest.mark.integration
def test_each_segments_output_reaches_s3_appended(s3, run):
    first = run(spec(s3, talking_function, max_iterations=2))
    assert lines(s3, "stdout") == ["fn 1", "fn 2"]
    discard_parked([first.live_token])
    run(spec(s3, talking_function, restore=f"{TRIAL_DIR}/checkpoint_000002", max_iterations=1))
    assert lines(s3, "stdout") == ["fn 1", "fn 2", "resumed at 2", "fn 3"]
    assert lines(s3, "stderr") == ["fn err 1", "fn err 2", "fn err 3"]


@pytest.mark.integration
def test_a_long_segments_output_reaches_s3_while_it_runs(s3, run, monkeypatch):
    """A FIFO trial is one segment: its output is appended every UPLOAD_EVERY_S, not only
    at its end."""
    monkeypatch.setattr(trial_output, "UPLOAD_EVERY_S", 0.1)

    def waits_for_its_output(config: dict[str, Any]) -> None:
        print("early")
        wait_for(
            lambda: s3.file_exists(TRIAL_DIR, "stdout") and lines(s3, "stdout") == ["early"],
            timeout_s=60,
            what="the trial's output on S3 while it runs",
        )
        print("late")
        report({"x": 1})

    run(spec(s3, waits_for_its_output, max_iterations=1))
    assert lines(s3, "stdout") == ["early", "late"]


# -- through the Tuner, on Dask workers -----------------------------------------


def prints(config: dict[str, Any]) -> None:
    for i in range(4):
        print(f"a={config['a']} step {i + 1}", flush=True)
        print(f"a={config['a']} warn {i + 1}", file=sys.stderr)
        report({"score": config["a"] * (i + 1)})


def trial_files(storage: Storage, grid: Any, name: str) -> dict[float, list[str]]:
    """Each trial's file ``name``, by its ``a``."""
    return {
        result.config["a"]: storage.read_text(
            posixpath.basename(result.path.rstrip("/")), name
        ).splitlines()
        for result in grid
    }


@pytest.mark.integration
@pytest.mark.parametrize("where", ["local", "s3"])
def test_the_tuners_trials_write_their_files_on_the_workers(
    prefect_server, dask_cluster, tmp_path, where, request
):
    if where == "s3":
        s3 = request.getfixturevalue("s3")
        storage, options = s3, s3.storage_options
    else:
        storage, options = Storage(str(tmp_path)), None
    popflow.init(dask_cluster)
    try:
        grid = tune.Tuner(
            prints,
            param_space={"a": tune.grid_search([1, 2])},
            tune_config=tune.TuneConfig(
                metric="score",
                mode="max",
                scheduler=tune.schedulers.ASHAScheduler(grace_period=1, max_t=4),
            ),
            run_config=tune.RunConfig(
                name="talk",
                storage_path=storage.url,
                storage_options=options,
                log_to_file=("out.txt", "err.txt"),
                verbose=0,
            ),
        ).fit()
    finally:
        popflow.init()
    assert not grid.errors
    exp = storage.child("talk")
    outs, errs = trial_files(exp, grid, "out.txt"), trial_files(exp, grid, "err.txt")
    for result in grid:  # ASHA cut it into segments at its rungs: every line, in order
        a, n = result.config["a"], result.metrics["training_iteration"]
        assert outs[a] == [f"a={a} step {i}" for i in range(1, n + 1)]
        assert errs[a] == [f"a={a} warn {i}" for i in range(1, n + 1)]


@pytest.mark.integration
def test_a_restored_tuner_appends_to_the_trials_files(prefect_server, dask_cluster, tmp_path):
    """The first run stops after one round; Tuner.restore goes on, writing on into the
    same files (the first run's lines stay)."""
    popflow.init(dask_cluster)
    try:
        popflow.run(
            talking_function,
            {"n": 3, "x": tune.grid_search([1, 2])},
            storage=str(tmp_path),
            name="again",
            log_to_file=True,
            scheduler=tune.schedulers.ASHAScheduler(
                time_attr="training_iteration", grace_period=1, max_t=3, reduction_factor=3
            ),
            metric="i",
            mode="max",
            max_rounds=1,
            verbose=0,
        )
        grid = tune.Tuner.restore(str(tmp_path / "again"), talking_function).fit()
    finally:
        popflow.init()
    assert not grid.errors
    exp = Storage(str(tmp_path / "again"))
    for result in grid:
        folder = posixpath.basename(result.path.rstrip("/"))
        n = result.metrics["training_iteration"]
        out = exp.read_text(folder, "stdout").splitlines()
        # the first run's line, then the resume's (its lines come only from segments the
        # restored run sent): live where the trial waits on its worker still, else from
        # its checkpoint, or from scratch where the first run ended before committing it
        resumed = ([], ["resumed at 1"], ["fn 1"])
        assert n == 3 and out[0] == "fn 1" and out[1:] in [[*r, "fn 2", "fn 3"] for r in resumed]
