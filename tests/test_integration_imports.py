"""Ray's framework callbacks without their library say which extra installs it (and Keras
without a backend says how to name one), instead of a bare ``ModuleNotFoundError`` from
deep inside an import."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.scripts import hiding

pytestmark = pytest.mark.system


def import_error(tmp_path, module: str, hidden: set[str], env: dict[str, str]) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        env=hiding(tmp_path / "hide", hidden, env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    return proc.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("module", "hidden", "says"),
    [
        ("popflow.tune.integration.pytorch_lightning", {"lightning", "pytorch_lightning"},
         "ImportError: Lightning's callback needs lightning: pip install 'popflow[lightning]'"),
        ("popflow.tune.integration.keras", {"keras"},
         "ImportError: Keras's callback needs keras: pip install 'popflow[keras]'"),
    ],
)  # fmt: skip
def test_a_missing_library_names_its_extra(tmp_path, module, hidden, says):
    assert import_error(tmp_path, module, hidden, {**os.environ, "KERAS_BACKEND": "torch"}) == says


def test_keras_without_its_backend_says_how_to_choose_one(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}  # TensorFlow's
    last = import_error(tmp_path, "popflow.tune.integration.keras", {"tensorflow"}, env)
    assert last.startswith("ImportError: keras imports its backend's module 'tensorflow'")
    assert "KERAS_BACKEND=torch" in last
