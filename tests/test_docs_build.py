"""``make docs``'s build: the MkDocs site builds with ``--strict`` (any warning fails it),
and its generated pages (API, command line, modules, benchmark results) have content."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parent.parent


def test_the_docs_build_strictly_with_generated_pages(tmp_path: Path) -> None:
    site = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's banner about its successor
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "WARNING" not in out, out

    def page(name: str) -> str:
        return (site / name).read_text(encoding="utf-8")

    cli = page("reference/cli.html")
    for command in ("status", "show", "resume", "plot", "server"):
        assert f"popflow {command}" in cli
    assert "--force-takeover" in cli  # an option, from the parser itself
    modules = page("reference/modules.html")
    assert (
        "popflow.flows.driver.controller" in modules and "plan, dispatch, reduce, commit" in modules
    )
    assert "examples/digits_mlp.py" in modules
    api = page("reference/api/popflow.html")
    assert "popflow.run" in api and "param_space" in api
    assert "get_best_result" in api  # ResultGrid's methods, from the code
    assert "ASHAScheduler" in page("reference/schedulers.html")
    assert "Tuner" in page("reference/api/tune.html")
    results = page("benchmarks/RESULTS.html")
    assert "PBT orchestration per round" in results
    linked = page("tutorials/pbt-real-model.html")
    assert (
        'href="../benchmarks/RESULTS.html#pbt-pb2-asha-and-random-search-on-a-real-model"' in linked
    )
