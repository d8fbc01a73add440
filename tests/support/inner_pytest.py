"""A pytest session of its own, in a process of its own, for the tests of the suite's plugins.

pytest's ``pytester`` fixture is not used: when it ends it puts ``sys.modules`` back by
clearing the dict and refilling it, and a thread an earlier test left running (Prefect's,
Dask's, W&B's) that imports in that instant loads a second ``importlib`` module, without
``util`` or ``metadata``, in place of the first. A CI run failed so: every later
``import importlib.metadata`` (pluggy's, loading a plugin) and W&B's
``importlib.util.find_spec`` raised ``AttributeError`` for the rest of the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

#: tests/: ``support.<plugin>`` imports from there
TESTS = str(Path(__file__).resolve().parent.parent)
MARKERS = "[pytest]\nmarkers =\n    unit: u\n    integration: i\n    system: s\n"


def write_tests(folder: Path, **modules: str) -> None:
    """Each ``name=source`` as ``folder/name.py`` (dedented), beside an ini of the tiers."""
    (folder / "pytest.ini").write_text(MARKERS)
    for name, source in modules.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(source))


def run_pytest(
    folder: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 300.0,
    **popen: Any,
) -> pytest.RunResult:
    """``python -m pytest *args`` in ``folder``, with tests/ on the path, its own basetemp and
    no cache; ``env`` (default: this process's) is the environment it starts with, and
    ``popen`` goes to ``subprocess.run`` (``user=``, ``group=``)."""
    environ = dict(os.environ if env is None else env)
    environ["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, environ.get("PYTHONPATH", "")) if p)
    environ.pop("PYTEST_ADDOPTS", None)
    command = [
        sys.executable,
        "-m",
        "pytest",
        f"--basetemp={folder / 'basetemp'}",
        "-p",
        "no:cacheprovider",
        *args,
    ]
    start = time.monotonic()
    done = subprocess.run(
        command,
        cwd=folder,
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        **popen,
    )
    return pytest.RunResult(
        done.returncode,
        done.stdout.splitlines(),
        done.stderr.splitlines(),
        time.monotonic() - start,
    )
