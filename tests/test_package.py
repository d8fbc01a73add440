"""popflow installs one package: a user's project keeps its own ``flows``, ``tasks``,
``schedulers`` and ``infra``, and popflow runs in it all the same."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import popflow

USER_SCRIPT = '''
import json
import sys

import flows  # the user's Prefect-style package
import infra
import schedulers
import tasks  # a Celery/invoke-style tasks.py
from flows.pipeline import STAGE

import popflow
from popflow import PopulationBasedTraining, Trainable, run, uniform


class Climb(Trainable):
    """Uses the user's own `tasks` module on the workers too."""

    def setup(self, config):
        self.x = 0.0

    def step(self):
        self.x = tasks.advance(self.x, self.config["lr"])
        return {"score": self.x, "owner": tasks.OWNER}

    def save_checkpoint(self, checkpoint_dir):
        return {"x": self.x}

    def load_checkpoint(self, checkpoint):
        self.x = checkpoint["x"]


if __name__ == "__main__":  # process workers import this script
    results = run(
        Climb,
        param_space={"lr": uniform(0.1, 1.0)},
        scheduler=PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=2,
            hyperparam_mutations={"lr": uniform(0.1, 1.0)},
            synch=True,
        ),
        metric="score",
        mode="max",
        num_samples=2,
        stop={"training_iteration": 4},
        storage=sys.argv[1],
        name="user-project",
        seed=0,
        n_workers=2,
    )
    best = results.get_best_result()
    print(json.dumps({
        "owners": sorted({r.metrics["owner"] for r in results}),
        "iterations": [r.metrics["training_iteration"] for r in results],
        "errors": results.num_errors,
        "modules": {m.__name__: m.__file__ for m in (flows, infra, schedulers, tasks)},
        "stage": STAGE,
        "popflow": popflow.__file__,
    }))
'''


def make_project(root: Path) -> Path:
    """A project laid out as our users' are, with names popflow's layers once had."""
    (root / "flows").mkdir(parents=True)
    (root / "flows" / "__init__.py").write_text("OWNER = 'user'\n")
    (root / "flows" / "pipeline.py").write_text("STAGE = 'train'\n")
    (root / "infra").mkdir()
    (root / "infra" / "__init__.py").write_text("OWNER = 'user'\n")
    (root / "schedulers.py").write_text("OWNER = 'user'\n")
    (root / "tasks.py").write_text(
        textwrap.dedent(
            """
            OWNER = "user"

            def advance(x, lr):
                return x + lr
            """
        )
    )
    (root / "train.py").write_text(USER_SCRIPT)
    return root


@pytest.mark.system
def test_a_project_with_its_own_flows_tasks_schedulers_and_infra_runs_popflow(
    prefect_server, tmp_path: Path
) -> None:
    project = make_project(tmp_path / "project")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [sys.executable, "train.py", str(tmp_path / "results")],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["errors"] == 0
    assert report["iterations"] == [4, 4]
    assert report["owners"] == ["user"]  # the workers imported the user's tasks.py
    assert report["stage"] == "train"
    for name, path in report["modules"].items():
        assert path.startswith(str(project)), (name, path)
    assert not report["popflow"].startswith(str(project))


@pytest.mark.system
def test_only_popflow_is_installed_at_the_top_level() -> None:
    dist = importlib.metadata.distribution("popflow")
    top = (dist.read_text("top_level.txt") or "").split()
    assert top in ([], ["popflow"]), top  # editable installs may list none
    packages = {
        name for name in ("flows", "tasks", "schedulers", "infra") if _importable_outside(name)
    }
    assert packages == set()


def _importable_outside(name: str) -> bool:
    """Whether ``import name`` works from a folder that has no such module."""
    probe = subprocess.run(
        [sys.executable, "-c", f"import {name}"],
        cwd="/",
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        capture_output=True,
        timeout=60,
    )
    return probe.returncode == 0


@pytest.mark.unit
def test_the_public_surface() -> None:
    expected = {
        "run",
        "CheckpointConfig",
        "ResultGrid",
        "Result",
        "Trainable",
        "report",
        "get_checkpoint",
        "Checkpoint",
        "PopulationBasedTraining",
        "PopulationBasedTrainingReplay",
        "AsyncHyperBandScheduler",
        "ASHAScheduler",
        "HyperBandScheduler",
        "MedianStoppingRule",
        "FIFOScheduler",
        "TrialScheduler",
        "uniform",
        "quniform",
        "loguniform",
        "qloguniform",
        "randn",
        "randint",
        "qrandint",
        "lograndint",
        "choice",
        "grid_search",
        "sample_from",
    }
    assert expected <= set(popflow.__all__)
    for name in popflow.__all__:
        assert getattr(popflow, name) is not None
    from popflow.schedulers import ASHAScheduler

    assert popflow.ASHAScheduler is ASHAScheduler
    from popflow import tune
    from popflow.tune.schedulers import ASHAScheduler as RayNamed

    assert RayNamed is ASHAScheduler and tune.Tuner and tune.TuneConfig and tune.RunConfig


@pytest.mark.system
def test_importing_popflow_does_not_import_prefect() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, popflow; print('prefect' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.strip() == "False", probe.stderr


@pytest.mark.system
def test_a_worker_imports_the_worker_side_without_the_flows_layer() -> None:
    """What a Dask worker imports (its preload, the user's trainable with ``from popflow
    import report``) leaves out the driver's layer; the driver's names still import on
    first use, as attributes or by ``from popflow import ...``."""
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, popflow.tasks.runner; from popflow import report, Trainable, uniform; "
            "print(any(m.startswith('popflow.flows') for m in sys.modules)); "
            "from popflow import run, ResultGrid; import popflow; "
            "print(popflow.run is run, popflow.ResultGrid is ResultGrid, popflow.init.__name__)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.split("\n")[:2] == ["False", "True True init"], probe.stderr
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        popflow.nothing_here  # noqa: B018


@pytest.mark.unit
def test_every_package_folder_is_in_the_wheel() -> None:
    """An editable install finds every folder; a wheel holds only the packages
    pyproject.toml lists (``popflow.flows.events`` was missing: ``from popflow import
    tune`` failed in a non-editable install)."""
    import tomllib

    root = Path(__file__).resolve().parent.parent
    setup = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set()
    for package, folder in setup["package-dir"].items():
        for here, subs, files in os.walk(root / folder):
            subs[:] = [s for s in subs if not s.startswith((".", "__"))]
            if "__init__.py" in files:
                rel = Path(here).relative_to(root / folder)
                found.add(".".join([package, *rel.parts]))
    assert sorted(found - set(setup["packages"])) == []
    assert sorted(set(setup["packages"]) - found) == []
