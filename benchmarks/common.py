"""Shared helpers of the benchmarks: a Prefect server, subprocess runs, tables, JSON output.

Every benchmark compares popflow and Ray Tune *in the same run* (the machine
is shared and its load varies), each side in a fresh subprocess so one does
not inherit the other's imports, threads or memory. A runner subprocess
prints one line ``RESULT_JSON {...}`` with its figures; :func:`run_json`
collects it and adds the process wall time measured from outside.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
BENCHMARKS = REPO / "benchmarks"
RESULTS_DIR = REPO / "bench-results"
RESULT_PREFIX = "RESULT_JSON "

# popflow itself is installed; the repository root stays off the path (its popflow/
# folder is only the facade of the installed layers)
for _path in (str(EXAMPLES), str(BENCHMARKS)):
    if _path not in sys.path:
        sys.path.insert(0, _path)


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` so that Dask pickles its functions and classes by value.

    The examples folder is no package; registering the module with cloudpickle
    means worker processes need not find it on their own ``sys.path``.
    """
    import cloudpickle

    module = importlib.import_module(name)
    cloudpickle.register_pickle_by_value(module)
    return module


class CommitRecorder:
    """Every commit the drivers of this process publish: its wall-clock time, bytes and
    seconds to encode and publish (the commit log itself keeps only what a resume needs:
    older commits are pruned). Use as a context manager around ``popflow.run``."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.sizes: list[int] = []
        self.seconds: list[float] = []
        self.results: list[int] = []  # results the commit carries
        self.snapshots: list[bool] = []  # whether it holds the whole state
        self.rss_mib: list[float] = []  # the process's resident memory after it

    def __enter__(self) -> CommitRecorder:
        from popflow.infra.store.commit_log import ExperimentLog
        from popflow.infra.store.layout import commit_path

        self._original = original = ExperimentLog.commit
        recorder = self

        def commit(log: ExperimentLog, payload: dict[str, Any], **kwargs: Any) -> int:
            snapshot = kwargs.get("snapshot")
            recorder.snapshots.append(log.snapshot_due() if snapshot is None else snapshot)
            start = time.perf_counter()
            seq = original(log, payload, **kwargs)
            recorder.seconds.append(time.perf_counter() - start)
            recorder.times.append(float(payload["time"]))
            recorder.sizes.append(log.storage.size(commit_path(seq)))
            recorder.results.append(sum(map(len, payload.get("results", {}).values())))
            recorder.rss_mib.append(rss_mib())
            return seq

        ExperimentLog.commit = commit  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        from popflow.infra.store.commit_log import ExperimentLog

        ExperimentLog.commit = self._original  # type: ignore[method-assign]


def rss_mib() -> float:
    """This process's resident memory now, in MiB (Linux)."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def emit(result: dict[str, Any]) -> None:
    """Print a runner's figures as the line :func:`run_json` looks for."""
    print(RESULT_PREFIX + json.dumps(result, default=str), flush=True)


def loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def run_json(
    cmd: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 1800.0,
    log_path: Path | None = None,
) -> dict[str, Any]:
    """Run ``cmd``; return its ``RESULT_JSON`` dict plus ``process_wall_s`` and the load.

    The whole output goes to ``log_path`` (if given); on failure its tail is raised.
    """
    load_before = loadavg()
    start = time.perf_counter()
    proc = subprocess.run(
        list(cmd),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        cwd=str(REPO),
        check=False,
    )
    wall = time.perf_counter() - start
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(proc.stdout)
    found = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not found:
        tail = "\n".join(proc.stdout.splitlines()[-40:])
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{tail}")
    result = json.loads(found[-1][len(RESULT_PREFIX) :])
    result["process_wall_s"] = wall
    result["load_before"] = load_before
    result["load_after"] = loadavg()
    return result


def python() -> str:
    """This interpreter (the project venv's, which also has ``ray[tune]`` from the bench extra)."""
    return sys.executable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrefectServer:
    """``prefect server start`` on 127.0.0.1 with its own ``PREFECT_HOME``, until closed.

    ``startup_s`` is the time from launch until ``/api/health`` answers.
    """

    def __init__(self, timeout: float = 180.0) -> None:
        self.home = tempfile.mkdtemp(prefix="popflow-bench-prefect-")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/api"
        self.env = {
            **os.environ,
            "PREFECT_HOME": self.home,
            "PREFECT_SERVER_API_HOST": "127.0.0.1",
            "PREFECT_SERVER_API_PORT": str(self.port),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_ENABLED": "false",
        }
        self.env.pop("PREFECT_API_URL", None)
        self._log = open(os.path.join(self.home, "server.log"), "wb")  # noqa: SIM115
        start = time.perf_counter()
        self.proc = subprocess.Popen(
            self._command(),
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: closed as a whole below
        )
        try:
            self._wait_healthy(timeout)
        except BaseException:
            self.close()
            raise
        self.startup_s = time.perf_counter() - start

    def _command(self) -> list[str]:
        host = ["--host", "127.0.0.1", "--port", str(self.port)]
        return [python(), "-m", "prefect", "server", "start", *host]

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"prefect server exited with {self.proc.returncode}; see {self.home}/server.log"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"prefect server at {self.url} not healthy after {timeout} s")

    def client_env(self) -> dict[str, str]:
        """The environment for a process whose flows should report to this server."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env["PREFECT_API_URL"] = self.url
        env["PREFECT_HOME"] = os.path.join(self.home, "client")
        return env

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)  # the group this object started
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._log.close()

    def __enter__(self) -> PrefectServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("prefect", "distributed", "numpy", "ray"):
        try:
            out[name] = importlib.import_module(name).__version__
        except Exception:  # not installed: the figure just says so
            out[name] = "not installed"
    return out


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "loadavg_1min": loadavg(),
    }


def write_json(benchmark: str, figures: dict[str, Any]) -> Path:
    """Write ``bench-results/<benchmark>_<timestamp>.json`` and return its path."""
    RESULTS_DIR.mkdir(exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = RESULTS_DIR / f"{benchmark}_{stamp}.json"
    payload = {
        "benchmark": benchmark,
        "time": datetime.datetime.now().isoformat(timespec="seconds"),
        "argv": sys.argv[1:],
        "machine": machine(),
        "versions": versions(),
        **figures,
    }
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return path


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain fixed-width table (floats with 3 significant decimals)."""

    def cell(x: Any) -> str:
        if isinstance(x, float):
            return f"{x:.3f}" if abs(x) < 100 else f"{x:.1f}"
        return str(x)

    cells = [[cell(x) for x in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[str]:
    """A temporary folder for experiment storage, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=prefix) as d:
        yield d
