"""An edited commit cannot turn storage against the machine: paths popflow takes from
stored state stay inside the experiment, on local disk and on S3.

The adversary's tools: a commit edited as a person with write access would (the
JSON line changed, its SHA-256 line recomputed), so its checksum holds.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from typing import Any

import pytest
import s3fs
from trainables import ParityTrainable

from popflow import CheckpointConfig, ResultGrid, run
from popflow.flows.api.cli import main
from popflow.flows.experiment.commit_paths import check_commit_paths
from popflow.flows.experiment.trial_table import TrialRecord
from popflow.infra.jsonutil import jsonable
from popflow.infra.storage.folder import Storage
from popflow.infra.storage.safe_paths import UnsafePath
from popflow.infra.store.checkpoints import CheckpointError, fetch_checkpoint
from popflow.infra.store.commit_log import STATE_KEYS, ExperimentLog
from popflow.infra.store.layout import MANIFEST, commit_path
from popflow.schedulers import PopulationBasedTraining, Trial
from popflow.tasks.specs import CheckpointRecord


def forge_newest_commit(storage: Storage, edit: Callable[[dict, dict], None]) -> None:
    """Rewrite the newest commit with ``edit(state, record)`` applied: its JSON line
    edited, its SHA-256 line recomputed (a plain SHA-256, as anyone can)."""
    log = ExperimentLog(storage)
    seq = log.commit_numbers()[-1]
    commit = log.read(seq)
    state = {k: commit.pop(k) for k in STATE_KEYS if k in commit}
    edit(state, commit)
    body = json.dumps({**commit, "state": state})
    digest = hashlib.sha256(body.encode()).hexdigest()
    storage.write_bytes(f"{body}\n{digest}\n".encode(), commit_path(seq))


def escape(state: dict, _record: dict) -> None:
    """The issue's forgery: a trial folder and an old checkpoint's name that climb out."""
    state["trials"][0]["dirname"] = "../../escaped_trial"
    state["trials"][1]["checkpoints"].insert(
        0, {"name": "../../../victim_dir", "iteration": 0, "result": {}}
    )


def pbt_kwargs() -> dict[str, Any]:
    """Synchronous PBT, 2 trials, a checkpoint per iteration and only 1 kept (retention
    deletes), one round per run."""
    return dict(
        param_space={"a": 1, "c": 1},
        num_samples=2,
        scheduler=PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=1,
            hyperparam_mutations={"c": [1, 2]},
            synch=True,
        ),
        metric="mean_accuracy",
        mode="max",
        stop={"training_iteration": 4},
        checkpoint_config=CheckpointConfig(checkpoint_frequency=1, num_to_keep=1),
        seed=0,
    )


def local_files(root: str) -> dict[str, bytes]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


@pytest.mark.integration
def test_a_forged_commit_on_local_disk_stops_the_resume_and_changes_nothing(tune_env, tmp_path):
    root = tune_env["storage"]  # <tmp_path>/results
    run(ParityTrainable, **pbt_kwargs(), **tune_env, name="exp", max_rounds=1)
    victim = tmp_path / "victim_dir"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    forge_newest_commit(Storage(os.path.join(root, "exp")), escape)
    before = local_files(str(tmp_path))

    with pytest.raises(UnsafePath, match=r"gives trial \w+ the folder '../../escaped_trial'"):
        run(ParityTrainable, **pbt_kwargs(), **tune_env, name="exp", resume=True)
    assert not (tmp_path / "escaped_trial").exists()
    assert (victim / "precious.txt").read_text() == "keep me"
    assert local_files(str(tmp_path)) == before  # no lease, no log cut back, nothing

    # every reader refuses it too, and the command line says so in one line
    with pytest.raises(UnsafePath):
        ResultGrid.from_path(os.path.join(root, "exp"))
    assert local_files(str(tmp_path)) == before


@pytest.mark.unit
@pytest.mark.parametrize("command", ["resume", "status", "show"])
def test_the_cli_reports_a_forged_commit_in_one_line(tmp_path, capsys, command):
    exp = tmp_path / "exp"
    storage = Storage(str(exp))
    log = ExperimentLog(storage)
    record = TrialRecord(Trial("t_00000", {"a": 1}), index=0, dirname="T_t_00000")
    record.checkpoints = [CheckpointRecord("../../../victim_dir", 1, {})]
    trial = jsonable(record.state())
    log.commit({"round": 1, "trials": [trial], "scheduler": {}, "derived": {}}, snapshot=True)
    before = local_files(str(tmp_path))
    with pytest.raises(SystemExit) as exit_info:
        main([command, str(exp)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("popflow: commit 1 of "), err
    assert "a checkpoint named '../../../victim_dir'" in err[0]
    assert local_files(str(tmp_path)) == before


@pytest.mark.integration
def test_a_forged_commit_on_s3_stops_the_resume_and_changes_nothing(
    prefect_server, dask_cluster, s3_server, s3_url
):
    _, options = s3_server
    where = dict(storage=f"{s3_url}/results", storage_options=options, dask_address=dask_cluster)
    run(ParityTrainable, **pbt_kwargs(), **where, name="exp", max_rounds=1)
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **options)
    bucket_prefix = s3_url.removeprefix("s3://")
    fs.pipe_file(f"{bucket_prefix}/victim_dir/precious.txt", b"keep me")
    forge_newest_commit(Storage(f"{s3_url}/results/exp", options), escape)
    fs.invalidate_cache()
    before = {p: fs.cat_file(p) for p in fs.find(bucket_prefix)}

    with pytest.raises(UnsafePath, match=r"'\.\./\.\./escaped_trial'"):
        run(ParityTrainable, **pbt_kwargs(), **where, name="exp", resume=True)
    fs.invalidate_cache()
    assert not fs.find(f"{bucket_prefix}/escaped_trial")
    assert fs.cat_file(f"{bucket_prefix}/victim_dir/precious.txt") == b"keep me"
    assert {p: fs.cat_file(p) for p in fs.find(bucket_prefix)} == before


GOOD = {
    "seq": 7,
    "trials": [
        {
            "trial_id": "a_00000",
            "dirname": "T_a_00000",
            "checkpoints": [{"name": "checkpoint_000002"}, {"name": "checkpoint_000004_1"}],
            "restore": "T_a_00001/checkpoint_1000000",
        },
        {
            "trial_id": "a_00001",
            "dirname": "T_a_00001",
            "checkpoints": [{"name": "checkpoint_1000000"}],
            "restore": None,
        },
    ],
    "derived": {"T_a_00000/result.json": 10, "T_a_00001/progress.csv": 3, "pbt_global.txt": 1},
    "deleted": ["T_a_00000/checkpoint_000001"],
}


def changed(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    commit = json.loads(json.dumps(GOOD))
    where = commit
    for key in path[:-1]:
        where = where[key]
    where[path[-1]] = value
    return commit


@pytest.mark.unit
@pytest.mark.parametrize(
    ("commit", "message"),
    [
        (changed(("trials", 0, "dirname"), "../x"), "the folder '../x'"),
        (changed(("trials", 0, "dirname"), "a/b"), "the folder 'a/b'"),
        (changed(("trials", 0, "dirname"), ".popflow"), "the folder '.popflow'"),
        (changed(("trials", 0, "dirname"), 3), "the folder 3"),
        (changed(("trials", 1, "trial_id"), "../../t"), "names a trial '../../t'"),
        (changed(("trials", 0, "checkpoints", 0, "name"), "../v"), "checkpoint named '../v'"),
        (changed(("trials", 0, "checkpoints", 0, "name"), "checkpoint_1/../../v"), "named"),
        (changed(("trials", 0, "restore"), "T_a_00000/../../v"), "restore from"),
        (changed(("trials", 0, "restore"), "Elsewhere/checkpoint_000001"), "restore from"),
        (changed(("derived",), {"../../x/result.json": 1}), "derived log '../../x/result.json'"),
        (changed(("derived",), {"T_a_00000/params.json": 1}), "derived log"),
        (changed(("deleted",), ["T_a_00000/../../v"]), "deleted checkpoint"),
    ],
)
def test_only_popflows_own_names_pass(commit, message):
    check_commit_paths(GOOD, "s3://b/exp")  # the shape popflow writes passes
    with pytest.raises(UnsafePath, match=f"commit 7 of s3://b/exp .*{message}"):
        check_commit_paths(commit, "s3://b/exp")


@pytest.mark.unit
@pytest.mark.parametrize("url", ["/tmp/popflow-root/exp", "s3://bucket/exp"])
def test_storage_refuses_paths_that_leave_its_root(url):
    storage = Storage(url)
    for parts in [("..",), ("a", "../../b"), ("a/../..", "b"), ("../exp2",), ("a", "..", "..")]:
        with pytest.raises(UnsafePath, match="leaves"):
            storage.path(*parts)
        with pytest.raises(UnsafePath):
            storage.child(*parts)
    assert storage.path("a/../b") == f"{storage.root}/a/../b"  # stays inside: allowed
    assert storage.path("a..b", "c") == f"{storage.root}/a..b/c"


@pytest.mark.unit
def test_a_manifest_naming_files_outside_its_checkpoint_is_refused(tmp_path):
    storage = Storage(str(tmp_path / "exp"))
    manifest = {"files": {"../../../outside.txt": {"size": 1, "sha256": "0"}}, "metadata": {}}
    storage.write_text(json.dumps(manifest), "T", "checkpoint_000001", MANIFEST)
    storage.write_text("x", "outside.txt")  # inside the experiment, outside the checkpoint
    target = tmp_path / "download" / "here"
    with pytest.raises(CheckpointError, match="names files outside the checkpoint"):
        fetch_checkpoint(storage, "T/checkpoint_000001", str(target))
    assert not (tmp_path / "outside.txt").exists()


# -- links inside a local experiment folder never lead out of it (issue 46, break 5) --


@pytest.mark.unit
def test_a_trial_folder_planted_as_a_link_is_never_written_through(tmp_path):
    """A trial folder replaced by a link to another folder: popflow wrote checkpoints into
    that folder and deleted its files. Every path through the link is refused."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    exp = tmp_path / "exp"
    exp.mkdir()
    os.symlink(victim, exp / "trial_0")
    s = Storage(str(exp))
    for act in (
        lambda: s.write_text("x", "trial_0", "params.json"),
        lambda: s.remove("trial_0", "keep.txt"),
        lambda: s.remove_files(["trial_0/keep.txt"]),
        lambda: s.append_text("{}\n", "trial_0", "result.json"),
        lambda: s.read_text("trial_0", "keep.txt"),
        lambda: s.rename(("trial_0", "keep.txt"), ("moved.txt",)),
        lambda: s.child("trial_0"),
    ):
        with pytest.raises(UnsafePath, match="link"):
            act()
    assert sorted(os.listdir(victim)) == ["keep.txt"]
    assert (victim / "keep.txt").read_text() == "precious"


@pytest.mark.unit
def test_links_inside_the_experiment_and_a_linked_root_are_fine(tmp_path):
    real = tmp_path / "real"
    (real / "a").mkdir(parents=True)
    os.symlink(real, tmp_path / "root-link")  # the user's own link to the root
    s = Storage(str(tmp_path / "root-link"))
    os.symlink(real / "a", real / "b")  # a link that stays inside
    s.write_text("ok", "b", "f.txt")
    assert (real / "a" / "f.txt").read_text() == "ok"


@pytest.mark.unit
def test_a_resume_over_a_trial_folder_linked_out_stops_and_changes_nothing(tmp_path):
    """The whole resume path (the simulated backend: no cluster): an experiment whose
    trial folder an attacker swapped for a link to a victim folder."""
    from popflow import simulate

    kwargs = dict(
        param_space={"a": 1.0},
        metric="score",
        mode="max",
        num_samples=2,
        stop={"training_iteration": 3},
        storage=str(tmp_path / "results"),
        name="exp",
    )
    simulate(ParityTrainable, **kwargs)
    exp = tmp_path / "results" / "exp"
    trial = next(p for p in exp.iterdir() if p.is_dir() and not p.name.startswith("."))
    victim = tmp_path / "victim"
    os.rename(trial, victim)  # the victim holds what looks like the trial's files
    os.symlink(victim, trial)
    before = {p.name: p.read_bytes() for p in victim.rglob("*") if p.is_file()}
    log = ExperimentLog(Storage(str(exp)))
    latest = log.latest()
    log.commit(latest | {"trials": [t | {"status": "PENDING"} for t in latest["trials"]]})
    with pytest.raises(UnsafePath, match="link"):
        simulate(ParityTrainable, **kwargs, resume=True)
    after = {p.name: p.read_bytes() for p in victim.rglob("*") if p.is_file()}
    assert after == before
