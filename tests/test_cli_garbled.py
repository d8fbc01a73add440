"""A log file that passes its checksum but is not what popflow writes (``experiment.json``
garbled or of the wrong shape, a forged commit with a valid SHA-256 but missing or
mistyped fields) is one line from ``popflow status``/``show``/``resume`` naming the file,
exit status 2, no traceback, and nothing in the experiment changed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from trainables import ParityTrainable

from popflow import grid_search, run
from popflow.flows.api.cli import main
from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import STATE_KEYS, ExperimentLog, encode_commit
from popflow.infra.store.layout import commit_path

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def unfinished(prefect_server, dask_cluster, tmp_path_factory) -> str:
    """Two trials, one round committed of four iterations each: `resume` would go on."""
    storage = tmp_path_factory.mktemp("garbled") / "results"
    run(
        ParityTrainable,
        {"a": grid_search([1, 2])},
        stop={"training_iteration": 4},
        metric="mean_accuracy",
        mode="max",
        seed=3,
        storage=str(storage),
        name="exp",
        dask_address=dask_cluster,
        max_rounds=1,
        verbose=0,
    )
    return str(storage / "exp")


def files(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def forge_commit(path: Path, change: Any) -> str:
    """Commit N+1: the newest state, changed by ``change(record, state)``, with a right
    checksum. Its file's URL."""
    storage = Storage(str(path))
    log = ExperimentLog(storage)
    latest = log.latest()
    state = {k: latest[k] for k in STATE_KEYS if k in latest}
    record = {k: v for k, v in latest.items() if k not in state}
    record["seq"] = seq = latest["seq"] + 1
    change(record, state)
    storage.write_bytes(encode_commit(record, json.dumps(state)), commit_path(seq))
    return storage.full_url(commit_path(seq))


def trial(state: dict[str, Any]) -> dict[str, Any]:
    return state["trials"][0]


COMMITS = {
    "no status": (lambda r, s: trial(s).pop("status"), "trials[0] has no 'status'"),
    "unknown status": (
        lambda r, s: trial(s).update(status="WHATEVER"),
        "trials[0]['status'] is 'WHATEVER', but must be one of ERROR, PAUSED, PENDING",
    ),
    "trial not an object": (
        lambda r, s: s["trials"].__setitem__(0, "x"),
        "trials[0] is 'x', but must be an object",
    ),
    "no round": (lambda r, s: r.pop("round"), "it has no 'round'"),
    "round a string": (
        lambda r, s: r.update(round="three"),
        "'round' is 'three', but must be an int >= 0",
    ),
    "num_results a string": (
        lambda r, s: trial(s).update(num_results="two"),
        "trials[0]['num_results'] is 'two', but must be an int >= 0",
    ),
    "config a list": (
        lambda r, s: trial(s).update(config=[1]),
        "trials[0]['config'] is [1], but must be an object",
    ),
    "checkpoint of other fields": (
        lambda r, s: trial(s).update(checkpoints=[{"nope": 1}]),
        "trials[0]['checkpoints'][0] is {'nope': 1}, but must be an object of",
    ),
    "scheduler a list": (
        lambda r, s: s.update(scheduler=[1]),
        "'scheduler' is [1], but must be an object",
    ),
    "derived sizes negative": (
        lambda r, s: s.update(derived={"x/result.json": -1}),
        "'derived' is {'x/result.json': -1}, but must be sizes by path",
    ),
}


def fails_in_one_line(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    out = capsys.readouterr()
    assert out.out == "" and "Traceback" not in out.err
    (line,) = out.err.splitlines()
    return line


@pytest.mark.integration
@pytest.mark.parametrize("command", ["status", "show", "resume"])
@pytest.mark.parametrize("case", sorted(COMMITS))
def test_a_commit_of_the_wrong_shape_is_one_line_naming_it(
    unfinished, tmp_path, capsys, command, case
) -> None:
    path = Path(shutil.copytree(unfinished, tmp_path / "exp"))
    change, problem = COMMITS[case]
    url = forge_commit(path, change)
    before = files(path)
    line = fails_in_one_line([command, str(path)], capsys)
    assert line.startswith(f"popflow: {url} is not what popflow writes there: {problem}")
    assert files(path) == before


EXPERIMENT_FILES = {
    "garbled": (b'{"name": "exp", "seed', "not JSON (Unterminated string"),
    "not UTF-8": (b"\xff\xfe{}", "not JSON ('utf-8' codec can't decode"),
    "a list": (b"[1, 2]", "it holds a JSON list, not an object"),
    "name a number": (b'{"name": 3}', "'name' is 3, but must be a string or null"),
    "seed a string": (b'{"seed": "x"}', "'seed' is 'x', but must be an int >= 0 or null"),
    "mode unknown": (b'{"mode": "maximize"}', "'mode' is 'maximize', but must be 'min', 'max'"),
}


@pytest.mark.integration
@pytest.mark.parametrize("command", ["status", "show", "resume"])
@pytest.mark.parametrize("case", sorted(EXPERIMENT_FILES))
def test_a_garbled_experiment_json_is_one_line_naming_it(
    unfinished, tmp_path, capsys, command, case
) -> None:
    path = Path(shutil.copytree(unfinished, tmp_path / "exp"))
    content, problem = EXPERIMENT_FILES[case]
    (path / ".popflow" / "experiment.json").write_bytes(content)
    before = files(path)
    line = fails_in_one_line([command, str(path)], capsys)
    file = path / ".popflow" / "experiment.json"
    assert line.startswith(f"popflow: {file} is not what popflow writes there: {problem}")
    assert files(path) == before


@pytest.mark.integration
def test_resume_tries_the_commits_scheduler_state_before_writing(unfinished, tmp_path, capsys):
    """A scheduler state of the right JSON shape that the run's scheduler cannot take:
    resume says so (it would have taken the lease and committed a takeover first)."""
    path = Path(shutil.copytree(unfinished, tmp_path / "exp"))
    url = forge_commit(path, lambda r, s: s.update(scheduler={"metric": "m"}))
    before = files(path)
    line = fails_in_one_line(["resume", str(path)], capsys)
    assert line == (
        f"popflow: {url} holds a scheduler state FIFOScheduler cannot take "
        "(KeyError: 'mode'); nothing was changed"
    )
    assert files(path) == before


@pytest.mark.integration
def test_resume_needs_the_seed(unfinished, tmp_path, capsys):
    path = Path(shutil.copytree(unfinished, tmp_path / "exp"))
    info_file = path / ".popflow" / "experiment.json"
    info = json.loads(info_file.read_text())
    del info["seed"]
    info_file.write_text(json.dumps(info))
    before = files(path)
    line = fails_in_one_line(["resume", str(path)], capsys)
    assert line == f"popflow: {info_file} has no 'seed' to resume with"
    assert files(path) == before


@pytest.mark.system
@pytest.mark.parametrize("command", ["status", "show", "resume"])
def test_the_popflow_command_says_one_line(unfinished, tmp_path, command) -> None:
    """The installed command, in a process of its own: one line, exit status 2."""
    path = Path(shutil.copytree(unfinished, tmp_path / "exp"))
    url = forge_commit(path, lambda r, s: trial(s).pop("status"))
    popflow = os.path.join(os.path.dirname(sys.executable), "popflow")
    out = subprocess.run(
        [popflow, command, str(path)], capture_output=True, text=True, timeout=120, cwd=HERE
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stdout == "" and "Traceback" not in out.stderr
    assert out.stderr.splitlines() == [
        f"popflow: {url} is not what popflow writes there: trials[0] has no 'status'; "
        "nothing was changed"
    ]


@pytest.mark.integration
def test_resuming_a_wrong_shaped_commit_from_python_writes_nothing(
    unfinished, dask_cluster, tmp_path
) -> None:
    """run(resume=True) checks the commit before the lease: it used to publish its
    takeover commit first and fail after."""
    from popflow.flows.experiment.reading import MalformedExperiment

    path = Path(shutil.copytree(unfinished, tmp_path / "exp"))
    url = forge_commit(path, lambda r, s: trial(s).pop("status"))
    before = files(path)
    with pytest.raises(MalformedExperiment, match=f"{url} is not what popflow writes there"):
        run(
            ParityTrainable,
            {"a": grid_search([1, 2])},
            stop={"training_iteration": 4},
            metric="mean_accuracy",
            mode="max",
            storage=str(tmp_path),
            name="exp",
            dask_address=dask_cluster,
            resume=True,
            verbose=0,
        )
    assert files(path) == before
