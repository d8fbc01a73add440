"""The ``popflow`` command imports only what its command needs: ``--help`` answers at
once, with no Prefect, Dask, pandas or matplotlib (they took seconds under load)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.system

POPFLOW = Path(sys.executable).with_name("popflow")
#: What no ``--help`` needs (numpy and fsspec neither: they come with a command's reading).
HEAVY = ("prefect", "distributed", "dask", "pandas", "matplotlib", "numpy", "fsspec", "scipy")

PROBE = """
import json, sys
from popflow.flows.api.cli import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code,
                  "heavy": sorted({m.split(".")[0] for m in sys.modules} & set(%r))}))
"""


def imported_by(*argv: str) -> dict:
    """Run the command in a fresh interpreter; its exit code and the heavy packages imported."""
    probe = subprocess.run(
        [sys.executable, "-c", PROBE % (HEAVY,), *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return json.loads(probe.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["status", "--help"], ["resume", "--help"], ["plot", "--help"]],
)
def test_help_imports_no_prefect_dask_pandas_or_matplotlib(argv):
    assert imported_by(*argv) == {"code": 0, "heavy": []}


def test_the_installed_command_answers_help():
    out = subprocess.run([POPFLOW, "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: popflow") and "resume" in out.stdout


def test_the_facade_keeps_its_names_without_importing_them():
    """``import popflow`` is lazy (PEP 562), yet ``dir()`` and ``from popflow import X``
    give every public name."""
    code = (
        "import json, sys, popflow; before = sorted({m.split('.')[0] for m in sys.modules} "
        f"& set({HEAVY!r})); names = dir(popflow); from popflow import ASHAScheduler, run; "
        "print(json.dumps({'before': before, 'missing': sorted(set(popflow.__all__) - "
        "set(names)), 'run': run.__module__, 'subpackage': popflow.schedulers.__name__}))"
    )
    probe = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert json.loads(probe.stdout) == {
        "before": [],
        "missing": [],
        "run": "popflow.flows.api.launch",
        "subpackage": "popflow.schedulers",
    }, probe.stderr
