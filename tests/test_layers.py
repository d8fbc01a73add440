"""The layers of the design card, kept by import-linter's contracts (pyproject.toml).

The layers live in top-level folders that install as ``popflow.<layer>``
(setuptools' package-dir mapping). import-linter reads a package from one
folder tree, so the check runs on a copy laid out as installed:
``<tmp>/popflow/{schedulers,tasks,infra,flows}``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("schedulers", "tasks", "infra", "flows")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def installed_layout(target: Path) -> Path:
    """Copy the package's sources to ``target/popflow`` as they are installed."""
    package = target / "popflow"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "popflow", package, ignore=ignore)
    for layer in LAYERS:
        shutil.copytree(ROOT / layer, package / layer, ignore=ignore)
    return target


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_contract_is_kept(tmp_path: Path) -> None:
    out = lint_imports(installed_layout(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "5 kept, 0 broken" in out.stdout, out.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("schedulers/trial.py", "import fsspec", "schedulers are pure"),
        ("schedulers/trial.py", "from popflow.infra import jsonutil", "schedulers are pure"),
        # search algorithms: the pure ones here, adapters over libraries in flows/integrations
        ("schedulers/search/searcher.py", "import optuna", "schedulers are pure"),
        ("schedulers/search/repeater.py", "from popflow.flows import spec", "schedulers are pure"),
        ("tasks/progress.py", "import prefect", "worker code never imports"),
        ("infra/jsonutil.py", "from popflow.flows.spec import config", "infra never imports"),
        ("tasks/trainable.py", "from popflow.tasks import segment", "no import cycles"),
        ("flows/driver/packing.py", "import distributed", "the driver imports no"),
        ("flows/driver/packing.py", "import prefect", "the driver imports no"),
        (
            "flows/driver/packing.py",
            "from popflow.flows.console import live_table",
            "the driver imports no",
        ),
        (
            "flows/driver/packing.py",
            "from popflow.flows.backends import dask_backend",
            "the driver imports no",
        ),
        # indirectly: a module the driver imports that imports Dask breaks it too
        ("flows/experiment/trial_table.py", "import dask", "the driver imports no"),
        (
            "flows/experiment/trial_table.py",
            "from popflow.flows.driver import packing",
            "no import cycles",
        ),
    ],
)
def test_a_broken_contract_fails_the_check(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    tree = installed_layout(tmp_path)
    path = tree / "popflow" / module
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")
    out = lint_imports(tree)
    assert out.returncode != 0
    verdicts = [line for line in out.stdout.splitlines() if line.startswith(contract)]
    assert verdicts and verdicts[0].endswith("BROKEN"), out.stdout
