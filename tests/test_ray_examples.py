"""Ray Tune's own example scripts, taken from Ray's pinned wheel, run on popflow with only
their import lines changed: an example that stops running fails CI.

pip downloads the wheel (``benchmarks/ray_examples.py``'s ``RAY_VERSION``; no install, no
dependencies), its ``ray/tune/examples/*.py`` are unpacked and rewritten by the benchmark's
own functions, and each example in :data:`COVERED` runs with ``--smoke-test`` as a user
would run it: a fresh process on the embedded default (popflow's local Prefect server,
a local Dask cluster), through the benchmark's launcher, which reports each ``fit()``'s
trials and errors. The README's "Coming from Ray Tune" table lists the same examples.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from support.scripts import embedded_env

from popflow.infra import local_server

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import ray_examples as rx  # noqa: E402 (benchmarks/ is not a package)

#: The examples that need no dataset download, GPU, RLlib or TensorFlow and run on popflow.
COVERED = rx.EXAMPLES


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory) -> tuple[Path, Path]:
    """The rewritten scripts' folder and the Prefect home the runs share (its local server,
    started by the first run as for a user, stopped by its PID at the end)."""
    root = tmp_path_factory.mktemp("ray-examples")
    source = rx.examples_from_wheel(rx.RAY_VERSION, root / "wheel")
    rx.write_rewritten(source, root / "scripts")
    home = root / "prefect-home"
    yield root / "scripts", home
    local_server.stop(home)


@pytest.mark.system
@pytest.mark.parametrize("name", COVERED)
def test_rays_example_runs_on_popflow_with_only_its_imports_changed(rewritten, tmp_path, name):
    scripts, home = rewritten
    original = (scripts.parent / "wheel" / "ray" / "tune" / "examples" / f"{name}.py").read_text()
    changed = [
        (old, new)
        for old, new in zip(
            original.splitlines(), (scripts / f"{name}.py").read_text().splitlines(), strict=True
        )
        if old != new
    ]
    assert changed and all(re.match(r"\s*(from|import) ray\b", old) for old, _ in changed)
    cmd = [sys.executable, "-c", f"PREFIX = {rx.RESULT_PREFIX!r}\n" + rx.LAUNCHER, "popflow"]
    cmd += [str(scripts / f"{name}.py"), "--smoke-test"]
    env = {**embedded_env(home), "HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    env.update(rx.example_env(name, tmp_path))
    env.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    run = rx.run_example(cmd, env, tmp_path, 300.0, tmp_path / "output.log")
    output = (tmp_path / "output.log").read_text()
    assert run["rc"] == 0, f"{run.get('error')}\n{output[-4000:]}"
    fits = run["launcher"]["fits"]
    assert fits, output[-4000:]
    for fit in fits:
        assert fit["trials"] >= 1 and fit["errors"] == 0, (fit, output[-4000:])
        # a multi-objective run has no one metric for get_best_result() (nor has Ray's)
        assert "best_error" not in fit or fit["metric"] is None, fit


@pytest.mark.unit
def test_the_readme_lists_the_examples_ci_runs():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Coming from Ray Tune", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `(\w+)\.py` \|", section, flags=re.MULTILINE)
    assert listed == COVERED
    assert os.path.basename(__file__) in section
