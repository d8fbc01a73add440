"""``popflow resume`` finds the trainable where the run found it, from any folder, or
says exactly what to put on PYTHONPATH; it runs on the run's Dask scheduler, with a
budget of its own if given one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from trainables import ParityTrainable

from popflow import ResultGrid, grid_search, run
from popflow.flows.api.cli import main
from popflow.flows.experiment.reading import read_committed
from popflow.schedulers import PopulationBasedTraining
from popflow.tune import Tuner

POPFLOW = Path(sys.executable).with_name("popflow")

MODULE = """
import time

from popflow import Trainable

class Counter(Trainable):  # a slow model: 6 steps outlast the run's one round (1 s)
    def setup(self, config):
        self.n = 0
    def step(self):
        time.sleep(0.4)
        self.n += 1
        return {"n": self.n}
    def save_checkpoint(self, d):
        return {"n": self.n}
    def load_checkpoint(self, c):
        self.n = c["n"]
"""

DRIVER = """
from popflow import run
from counting import Counter

grid = run(Counter, stop={"training_iteration": 6}, storage="results", name="counted",
           max_rounds=1, n_workers=1, seed=0, checkpoint_config=__import__("popflow").CheckpointConfig(checkpoint_frequency=2))
print("STATUS", [r.status for r in grid])
"""


def sh(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, cwd=cwd, env=dict(os.environ), capture_output=True, text=True, timeout=300
    )


@pytest.mark.system
def test_resume_from_another_folder_finds_the_trainable(prefect_server, tmp_path):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "counting.py").write_text(textwrap.dedent(MODULE))
    (project / "driver.py").write_text(textwrap.dedent(DRIVER))
    first = sh([sys.executable, "driver.py"], project)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    assert "STATUS ['PENDING']" in first.stdout  # max_rounds=1: not finished
    experiment = str(project / "results" / "counted")
    resumed = sh([str(POPFLOW), "resume", experiment, "--n-workers", "1"], elsewhere)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert "counted: finished, 1 trials, 0 errors" in resumed.stdout

    # the module moved away: the message says where it was and what to add
    (project / "driver.py").write_text(textwrap.dedent(DRIVER).replace("counted", "moved"))
    assert sh([sys.executable, "driver.py"], project).returncode == 0
    shutil.move(project / "counting.py", tmp_path / "counting.py")
    lost = sh([str(POPFLOW), "resume", str(project / "results" / "moved")], elsewhere)
    assert lost.returncode != 0
    message = lost.stderr.strip().splitlines()[-1]
    assert message.startswith("popflow: cannot load the trainable 'counting:Counter'")
    assert f"add '{project}'" in message and "to PYTHONPATH" in message


@pytest.mark.unit
def test_bad_storage_options_are_one_line_and_exit_code_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["show", str(tmp_path / "exp"), "--storage-options", "{bad"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("popflow show: error: argument --storage-options: not JSON")


def _interrupted_run(tmp_path: Path) -> tuple[Path, Path]:
    """A project whose run of ``Counter`` stopped after one round: it and the experiment."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "counting.py").write_text(textwrap.dedent(MODULE))
    (project / "driver.py").write_text(textwrap.dedent(DRIVER))
    assert sh([sys.executable, "driver.py"], project).returncode == 0
    return project, project / "results" / "counted"


@pytest.mark.system
def test_a_forged_lease_is_refused_until_force_takeover(prefect_server, tmp_path):
    """A lease written with an expiry years ahead (forged, or a clock far off) by a
    driver on another machine: `popflow resume` says who holds it and how to take
    over; `--force-takeover` does, and the run finishes."""
    import json

    from popflow.infra.storage.folder import Storage
    from popflow.infra.store.layout import lease_path
    from popflow.infra.store.lease import lease_epochs

    project, experiment = _interrupted_run(tmp_path)
    storage = Storage(str(experiment))
    forged = {"host": "elsewhere", "pid": 4242, "id": "x", "epoch": 9, "expires": 4e9}
    storage.write_text(json.dumps(forged), lease_path(max(lease_epochs(storage)) + 1))
    refused = sh([str(POPFLOW), "resume", str(experiment), "--n-workers", "1"], project)
    assert refused.returncode == 2, (refused.stdout + refused.stderr)[-3000:]
    line = refused.stderr.strip().splitlines()[-1]
    assert "being run by pid 4242 on elsewhere" in line and "--force-takeover" in line
    forced = sh(
        [str(POPFLOW), "resume", str(experiment), "--n-workers", "1", "--force-takeover"], project
    )
    assert forced.returncode == 0, (forced.stdout + forced.stderr)[-3000:]
    assert "took" in forced.stderr and "from pid 4242 on elsewhere" in forced.stderr
    assert "counted: finished, 1 trials, 0 errors" in forced.stdout


@pytest.mark.system
def test_force_takeover_gets_past_a_garbled_lease_at_epoch_99999999(prefect_server, tmp_path):
    """The epoch after 99999999 is named with nine digits, 100000000.json, and is the newer:
    `--force-takeover` takes it over the garbled lease, the resume the one after, and the
    run finishes (not "took the lease ... at the same time (epoch 100000000)")."""
    from popflow.infra.storage.folder import Storage
    from popflow.infra.store.layout import lease_path
    from popflow.infra.store.lease import lease_epochs, lease_holder

    project, experiment = _interrupted_run(tmp_path)
    storage = Storage(str(experiment))
    storage.write_text("garbage", lease_path(99_999_999))
    forced = sh(
        [str(POPFLOW), "resume", str(experiment), "--n-workers", "1", "--force-takeover"], project
    )
    assert forced.returncode == 0, (forced.stdout + forced.stderr)[-3000:]
    assert "counted: finished, 1 trials, 0 errors" in forced.stdout
    assert lease_epochs(storage) == [10**8, 10**8 + 1]
    assert lease_holder(storage) is None  # released at the end


@pytest.mark.system
def test_resume_keeps_the_runs_scheduler_and_takes_a_new_budget(
    prefect_server, dask_cluster, tmp_path
):
    """A run given a Dask scheduler's address is resumed there (``popflow resume`` and
    ``Tuner.restore``) unless told otherwise; ``--max-rounds`` sets this run's budget
    (``none``: run to the end), and a run that stops at its budget says how to go on."""
    address = dask_cluster.scheduler.address
    pids = set(dask_cluster.run(os.getpid).values())
    pbt = PopulationBasedTraining(  # synchronous, a round per iteration: rounds are countable
        time_attr="training_iteration",
        perturbation_interval=1,
        hyperparam_mutations={"c": [1, 2]},
        synch=True,
    )
    common = {"metric": "mean_accuracy", "mode": "max", "seed": 3, "max_rounds": 1}
    run(ParityTrainable, {"a": grid_search([1, 2]), "c": 1}, scheduler=pbt, stop={"training_iteration": 6},
        storage=str(tmp_path), name="exp", dask_address=address, **common)  # fmt: skip
    path = str(tmp_path / "exp")
    assert read_committed(path).round == 1
    kept = json.loads(Path(path, ".popflow", "run_args.json").read_text())["args"]
    assert kept["dask_address"] == address and kept["max_rounds"] == 1

    more = sh([str(POPFLOW), "resume", path, "--max-rounds", "2"], tmp_path)
    assert more.returncode == 0, (more.stdout + more.stderr)[-3000:]
    assert f"popflow: resuming on the run's Dask scheduler {address}" in more.stderr
    assert read_committed(path).round == 3
    assert more.stdout.splitlines()[-2:] == [
        "exp: stopped at its budget (max_rounds=2) after 2 rounds, at round 3; 2 of 2 trials "
        f"to go, 0 errors, in {path}",
        f"go on with: popflow resume {path} --max-rounds 2 (2 rounds more; --max-rounds none: "
        "to the end)",
    ]

    Tuner.restore(path, ParityTrainable).fit()  # the run's own budget: one round more
    assert read_committed(path).round == 4

    rest = sh([str(POPFLOW), "resume", path, "--max-rounds", "none"], tmp_path)
    assert rest.returncode == 0, (rest.stdout + rest.stderr)[-3000:]
    assert rest.stdout.splitlines()[-1] == f"exp: finished, 2 trials, 0 errors, in {path}"
    grid = ResultGrid.from_path(path)
    assert [len(r.history) for r in grid] == [6, 6]
    assert {row["pid"] for r in grid for row in r.history} <= pids  # every segment ran there


@pytest.mark.unit
def test_resume_budget_flags_are_checked(tmp_path, capsys):
    for flag, value, rule in (
        ("--max-rounds", "0", "an int >= 1"),
        ("--max-rounds", "1.5", "an int >= 1"),
        ("--run-budget-s", "-3", "a number of seconds > 0"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(["resume", str(tmp_path / "exp"), flag, value])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.endswith(f"argument {flag}: is '{value}', but must be {rule} or 'none'")


@pytest.mark.unit
def test_the_command_line_chooses_the_cluster_and_the_budget():
    from argparse import Namespace

    from popflow.flows.api.cli_resume import budget_choice, cluster_choice

    kept = {"dask_address": "tcp://10.0.0.5:8786", "max_rounds": 5}

    def cluster(address=None, n_workers=None):
        return cluster_choice(Namespace(dask_address=address, n_workers=n_workers), kept)

    assert cluster() == {"dask_address": "tcp://10.0.0.5:8786", "n_workers": None}
    assert cluster("tcp://h:1") == {"dask_address": "tcp://h:1", "n_workers": None}
    assert cluster(n_workers=2) == {"dask_address": None, "n_workers": 2}  # an embedded one

    def budget(max_rounds=None, run_budget_s=None):
        return budget_choice(Namespace(max_rounds=max_rounds, run_budget_s=run_budget_s))

    assert budget() == {}  # the run's own
    assert budget(3, "none") == {"max_rounds": 3, "run_budget_s": None}
