"""The crash driver (tests/crash_driver.py) run as a process, and what its experiment
holds, compared across runs: the resume and fencing tests' reference point."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import ExperimentLog
from popflow.tasks.progress import comparable

DRIVER = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "crash_driver.py"
)


def drive(
    storage: str,
    name: str,
    scheduler: str,
    kill_at: str | None = None,
    env: dict | None = None,
    extra: list[str] | None = None,
    logs: list[str] | None = None,
) -> int:
    """Run the crash driver; its return code (``logs``: gets its stderr)."""
    cmd = [sys.executable, DRIVER, storage, name, scheduler, *(extra or [])]
    if kill_at:
        cmd += ["--kill-at", kill_at]
    proc = subprocess.run(
        cmd,
        start_new_session=True,
        capture_output=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
    if logs is not None:
        logs.append(proc.stderr.decode())
    if kill_at is None and proc.returncode != 0:
        raise AssertionError(proc.stderr.decode()[-3000:])
    return proc.returncode


def read_experiment(path: str) -> dict:
    """pbt_global.txt, every trial's results (without volatile fields) and the final state."""
    out: dict = {"trials": {}}
    global_log = os.path.join(path, "pbt_global.txt")
    out["pbt_global"] = open(global_log).read() if os.path.exists(global_log) else ""  # noqa: SIM115
    for entry in sorted(os.listdir(path)):
        result_file = os.path.join(path, entry, "result.json")
        if os.path.exists(result_file):
            with open(result_file) as f:
                out["trials"][entry] = [comparable(json.loads(line)) for line in f]
    log = ExperimentLog(Storage(path))
    final = log.latest()
    out["status"] = [t["status"] for t in final["trials"]]
    out["checkpoints_ok"] = all(
        os.path.exists(os.path.join(path, t["restore"], ".popflow_manifest.json"))
        for t in final["trials"]
        if t["restore"]
    )
    return out
