"""A deployed run as a user meets it (issue 13): trigger to first round, Prefect's cost
per round, and nothing else between.

Starts ``prefect server`` (127.0.0.1, its own home) and a process worker polling every
``--poll`` seconds (Prefect's default is 10), deploys ``pbt-benchmark-rounds`` from
``prefect.yaml``, and triggers it ``--runs`` times with ``smoke_test=true`` (8 members,
synchronous PBT, 2 rounds), a fresh experiment each. Per run, from the API and the
commit log:

- trigger -> first round: from ``prefect deployment run`` returning to the start of
  the ``round-1`` task run, and to round 1's commit on disk;
- Prefect per round: the round task runs' mean duration. It holds the round's
  training and commit too (the smoke members train in microseconds), so it is an
  upper bound on what Prefect adds per round (target <= 0.2 s).

    .venv/bin/python benchmarks/deployed_run.py            # 3 runs, worker polling 1 s
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import UUID

from common import PrefectServer, emit

ROOT = Path(__file__).resolve().parent.parent


def prefect(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "prefect", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode:
        raise RuntimeError(f"prefect {' '.join(args)}: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    return proc.stdout


def read(call: Any) -> Any:
    from prefect.client.orchestration import get_client

    async def go() -> Any:
        async with get_client() as client:
            return await call(client)

    return asyncio.run(go())


def one_run(env: dict[str, str], storage: str, name: str) -> dict[str, float]:
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterParentFlowRunId,
        TaskRunFilter,
        TaskRunFilterFlowRunId,
    )

    triggered = time.time()
    out = prefect(
        env,
        "deployment",
        "run",
        "pbt-benchmark/pbt-benchmark-rounds",
        "--param",
        f"storage={storage}",
        "--param",
        f"name={name}",
        "--param",
        "smoke_test=true",
        "--param",
        "max_rounds=null",
    )
    run_id = UUID(re.search(r"UUID: ([0-9a-f-]{36})", out).group(1))
    deadline = time.monotonic() + 300
    while True:
        run = read(lambda c: c.read_flow_run(run_id))
        if run.state.is_final():
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"flow run {run_id} still {run.state.name}")
        time.sleep(0.2)  # polling the API for the run's end
    if not run.state.is_completed():
        raise RuntimeError(f"the run ended {run.state.name}: {run.state.message}")
    (tune,) = read(
        lambda c: c.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[run_id])
            )
        )
    )
    rounds = read(
        lambda c: c.read_task_runs(
            task_run_filter=TaskRunFilter(flow_run_id=TaskRunFilterFlowRunId(any_=[tune.id]))
        )
    )
    rounds = sorted(rounds, key=lambda r: r.start_time)
    commits = sorted((Path(storage) / name / ".popflow" / "commits").iterdir())
    round_one = next(p for p in commits if '"round": 1' in p.read_text(errors="replace")[:4000])
    return {
        "trigger_to_flow_run_start_s": run.start_time.timestamp() - triggered,
        "trigger_to_round1_start_s": rounds[0].start_time.timestamp() - triggered,
        "trigger_to_round1_commit_s": round_one.stat().st_mtime - triggered,
        "trigger_to_end_s": run.end_time.timestamp() - triggered,
        "round_task_mean_s": statistics.mean(
            (r.end_time - r.start_time).total_seconds() for r in rounds
        ),
        "rounds": len(rounds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--poll", type=float, default=1.0, help="the worker's query seconds")
    args = parser.parse_args()
    server = PrefectServer()
    env = {**server.env, "PREFECT_API_URL": server.url, "PWD": str(ROOT)}
    os.environ["PREFECT_API_URL"] = server.url
    worker = None
    try:
        prefect(env, "work-pool", "create", "popflow-local", "--type", "process", "--overwrite")
        prefect(env, "--no-prompt", "deploy", "--name", "pbt-benchmark-rounds")
        worker = subprocess.Popen(
            [sys.executable, "-m", "prefect", "worker", "start", "--pool", "popflow-local"],
            cwd=ROOT,
            env={**env, "PREFECT_WORKER_QUERY_SECONDS": str(args.poll)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        storage = tempfile.mkdtemp(prefix="popflow-deployed-")
        runs = [one_run(env, storage, f"latency_{i}") for i in range(args.runs)]
        for i, r in enumerate(runs):
            print(f"run {i}: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()))
        summary = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        summary.update(
            {"poll_s": args.poll, "runs": args.runs, "server_startup_s": server.startup_s}
        )
        print("median: " + ", ".join(f"{k} {v:.2f}" for k, v in summary.items()))
        emit({"benchmark": "deployed_run", **summary})
    finally:
        if worker is not None:
            os.killpg(worker.pid, 15)
            worker.wait(timeout=30)
        server.close()


if __name__ == "__main__":
    main()
