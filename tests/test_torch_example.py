"""``examples/pytorch_cnn.py`` on the CPU, as on a fresh machine with the ``torch`` extra:
a fresh process on the embedded default, PBT over a small CNN (``--smoke-test``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.scripts import embedded_env

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parent.parent


def test_the_smoke_run_trains_on_the_cpu_and_names_its_best_checkpoint(tmp_path, prefect_home):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "pytorch_cnn.py"), "--smoke-test"],
        cwd=tmp_path, env=embedded_env(prefect_home), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("best validation accuracy")]
    accuracy = float(line.split()[3])
    assert 0.5 < accuracy <= 1.0, line  # 4 epochs of a CNN on the digits learn something
    assert " on cpu with " in line
    checkpoint = line.rsplit("checkpoint ", 1)[1]
    assert (Path(checkpoint.removeprefix("Checkpoint('").removesuffix("')")) / "model.pt").exists()
