"""docs/tutorials/deploying.md, run as written: its ```bash blocks, in order, in a scratch
copy of the repository with a scratch ``PREFECT_HOME``. So the page and what works
cannot drift apart.

Each block runs in ``bash -euo pipefail`` from the copy's root; the variables a block
sets (``eval "$(popflow server start)"``'s ``PREFECT_API_URL``, ``RUN_ID``) carry to the
blocks after it, as in one terminal. A line right before a block's fence may say how
the block runs (invisible on the rendered page, whose text says the same to a reader):

- ``<!-- tutorial: background -->``: in a second terminal; it runs until the test
  stops it (the worker).
- ``<!-- tutorial: once ... -->``: the test first waits for what the page tells the
  reader to wait for (:data:`WAITS`), and checks it.

The test's environment only makes things sooner: the worker and the server's scheduler
look every second (``PREFECT_WORKER_QUERY_SECONDS``,
``PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS``; a minute and 10 s by default).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.polling import wait_for
from support.prefect_api import api

from popflow.infra import local_server
from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import ExperimentLog

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "tutorials" / "deploying.md"
FENCE = re.compile(r"^```(\S*)")
MARKER = re.compile(r"^<!-- tutorial: (.+?) -->$")
BACKGROUND = "background"
SCHEDULED = "once a scheduled run has completed"
TRAINING = "once the run has committed a round"
RERUN = "once the re-run has ended"
STOPPED = "once the background commands have stopped"
#: What each ``once ...`` marker waits for, and what the page says happens.
WAITS = (SCHEDULED, TRAINING, RERUN, STOPPED)
#: Seconds the test waits for any one thing before it fails.
DEADLINE_S = 300.0


@dataclass(frozen=True)
class Block:
    where: str  # the page's line of the opening fence
    code: str
    marker: str | None


def tutorial_blocks(path: Path = PAGE) -> list[Block]:
    """The page's ```bash blocks, each with the ``tutorial:`` marker right before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if opening.group(1) == "bash":
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            marked = MARKER.match(before.strip())
            code = "\n".join(lines[i + 1 : end]) + "\n"
            blocks.append(Block(f"deploying.md:{i + 1}", code, marked.group(1) if marked else None))
        i = end + 1
    return blocks


@pytest.mark.unit
def test_the_page_marks_what_the_test_needs():
    """Every marker is one the test knows, each wait once, in the page's order."""
    blocks = tutorial_blocks()
    markers = [b.marker for b in blocks if b.marker is not None]
    assert set(markers) <= {BACKGROUND, *WAITS}, markers
    assert [m for m in markers if m in WAITS] == list(WAITS)
    assert markers.count(BACKGROUND) == 1
    text = PAGE.read_text(encoding="utf-8")
    assert len(re.findall(r"^```bash", text, re.M)) == len(blocks)  # none missed


class Terminal:
    """Blocks run as in one terminal: each block's exported variables carry on."""

    def __init__(self, repo: Path, env: dict[str, str], state: Path) -> None:
        self.repo, self.env, self.state = repo, env, state
        self.background: list[tuple[subprocess.Popen, Any]] = []

    def script(self, code: str, keep: bool) -> str:
        # set -a: a block's plain assignments (RUN_ID=...) are exported, and carried
        load = f'set -a\n[ -f "{self.state}" ] && . "{self.state}"\nset -euo pipefail\n'
        return load + code + (f'export -p > "{self.state}"\n' if keep else "")

    def run(self, block: Block) -> str:
        proc = subprocess.run(
            ["bash", "-c", self.script(block.code, keep=True)],
            cwd=self.repo, env=self.env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        print(f"$ {block.where}\n{block.code}{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        assert proc.returncode == 0, f"{block.where} exited {proc.returncode}:\n{block.code}"
        return proc.stdout

    def start(self, block: Block) -> None:
        log = open(self.repo.parent / f"background-{len(self.background)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            ["bash", "-c", self.script(block.code, keep=False)],
            cwd=self.repo, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,  # stopped as a group, as Ctrl-C stops a terminal's
        )  # fmt: skip
        self.background.append((proc, log))

    def stop_background(self) -> None:
        """Ctrl-C (SIGINT to the group); SIGKILL to what is left 10 s later."""
        for proc, log in self.background:
            for sig, wait_s in ((signal.SIGINT, 10), (signal.SIGKILL, 30)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=wait_s)
                    break
                except ProcessLookupError:
                    break
                except subprocess.TimeoutExpired:
                    continue
            log.close()
        self.background.clear()

    def variable(self, name: str) -> str:
        found = re.search(rf'^declare -x {name}="([^"]*)"$', self.state.read_text(), re.M)
        assert found, f"no {name} after the blocks so far"
        return found.group(1)


def scratch_repo(where: Path) -> Path:
    """What the page's commands use of the repository, copied: its yaml files, the
    examples and ``flows/`` (the ``experiment`` deployment's entrypoint)."""
    repo = where / "repo"
    repo.mkdir()
    for name in ("prefect.yaml", "automations.yaml"):
        shutil.copy(ROOT / name, repo / name)
    ignore = shutil.ignore_patterns("__pycache__", "results")
    for name in ("examples", "flows"):
        shutil.copytree(ROOT / name, repo / name, ignore=ignore)
    return repo


@contextmanager
def on_api(url: str) -> Iterator[None]:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: url}):
        yield


def scheduled_smoke_completed() -> Any:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    runs = api(
        lambda c: c.read_flow_runs(
            deployment_filter=DeploymentFilter(
                name=DeploymentFilterName(any_=["pbt-benchmark-smoke"])
            )
        )
    )
    return [r for r in runs if r.auto_scheduled and r.state and r.state.is_completed()]


@pytest.mark.system
def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    repo = scratch_repo(tmp_path)
    home = tmp_path / "prefect-home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "POPFLOW_"))}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        PWD=str(repo),
        PREFECT_HOME=str(home),
        PREFECT_WORKER_QUERY_SECONDS="1",
        PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="1",
    )
    terminal = Terminal(repo, env, tmp_path / "state.sh")
    outputs: dict[str, str] = {}

    def api_url() -> str:
        return terminal.variable("PREFECT_API_URL")

    def wait_scheduled() -> None:
        with on_api(api_url()):
            wait_for(scheduled_smoke_completed, DEADLINE_S, "a scheduled run completed")

    def wait_training() -> None:
        log = ExperimentLog(Storage(str(repo / "results")).child("crash_demo"))
        wait_for(lambda: log.latest() is not None, DEADLINE_S, "crash_demo's first commit")

    def wait_rerun() -> None:
        run_id = terminal.variable("RUN_ID")
        with on_api(api_url()):

            def ended() -> Any:
                run = api(lambda c: c.read_flow_run(run_id))
                return run if run.state.is_final() and run.run_count > 1 else None

            run = wait_for(ended, DEADLINE_S, "the killed run re-run to its end")
            names = [s.name for s in api(lambda c: c.read_flow_run_states(run_id))]
        assert run.state.is_completed(), (run.state.name, run.state.message, names)
        assert "Crashed" in names and "Rerun" in names, names

    waits: dict[str, Callable[[], None]] = {
        SCHEDULED: wait_scheduled,
        TRAINING: wait_training,
        RERUN: wait_rerun,
        STOPPED: terminal.stop_background,
    }
    try:
        for block in tutorial_blocks():
            if block.marker == BACKGROUND:
                terminal.start(block)
                continue
            if block.marker is not None:
                waits[block.marker]()
            outputs[block.where] = terminal.run(block)
    finally:
        terminal.stop_background()
        local_server.stop(home)
    said = "".join(outputs.values())
    assert "Completed after 2 starts" in said
    assert "stopped the local Prefect server" in said
    assert local_server.running(home) is None
