"""What the console says while a run goes (issue 43, items 8d and 9): the trials in flight
show RUNNING."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

import pytest
from support.parity import parity_run

from popflow.flows.console.live_table import LiveTable
from popflow.schedulers import TrialStatus

pytestmark = pytest.mark.integration


def test_the_status_line_counts_the_trials_in_flight_as_running(tune_env, monkeypatch):
    """Asynchronous PBT on 2 workers: each status the console draws shows both slots'
    trials RUNNING while two or more can run. Before, it was drawn just after a result was
    reduced and before its slot was filled again ("7 PENDING | 1 RUNNING" while both
    workers trained)."""
    seen: list[Counter[TrialStatus]] = []
    tick = LiveTable.tick

    def counted(self: LiveTable, records, round_no):
        seen.append(Counter(rec.trial.status for rec in records))
        tick(self, records, round_no)

    monkeypatch.setattr(LiveTable, "tick", counted)
    parity_run([10, 20, 40, 30], synch=False, iterations=4, name="in-flight", verbose=1, **tune_env)
    assert seen
    wrong = [
        dict(c)
        for c in seen
        if c[TrialStatus.RUNNING] != min(2, c[TrialStatus.RUNNING] + c[TrialStatus.PENDING])
    ]
    assert not wrong, (len(wrong), len(seen), wrong[:5])


#: A script that loads a credentials block with INFO logging, as the examples do.
BLOCK_SCRIPT = """
import logging
logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
from prefect_aws import AwsCredentials
from popflow.infra.storage.options_cli import resolve_storage_options
AwsCredentials(aws_access_key_id="k", aws_secret_access_key="s").save("console-quiet", overwrite=True)
print("LOADING", flush=True)
print(resolve_storage_options("s3://bucket/exp", None, "aws-credentials/console-quiet")["key"])
"""


def test_loading_a_credentials_block_logs_no_http_request_lines(prefect_server, tmp_path):
    """``--credentials-block`` in a script with ``logging.basicConfig(level=INFO)`` printed
    httpx's request lines, the block's read with ``include_secrets=true`` among them."""
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "home")}
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK_SCRIPT],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream: the lines in the order they were said
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    out = proc.stdout
    assert proc.returncode == 0, out
    after = out[out.index("LOADING\n") :]  # the block's save above is the script's own
    assert after.splitlines()[1] == "k", out
    assert "include_secrets" not in after and "HTTP Request" not in after, after


def test_a_held_lease_is_one_line_with_a_way_on(tune_env):
    """A second run of an experiment another driver holds: the error reaches the caller
    without popflow's frames, the flow run's log says it in one line (it logged two
    tracebacks, ~30 lines each), and its hint names the experiment and works before the
    first commit too (`popflow resume --force-takeover` needs a commit: it exited 2)."""
    import traceback

    from support.prefect_api import run_logs, tune_runs
    from trainables import Misbehaving

    from popflow import run
    from popflow.infra.storage.folder import Storage
    from popflow.infra.store.lease import Lease, LeaseHeldError

    experiment = Storage(tune_env["storage"]).child("held-lease")
    with Lease(experiment, 60.0), pytest.raises(LeaseHeldError) as held:
        run(
            Misbehaving,
            {"a": 1, "how": "ok", "at": 9},
            name="held-lease",
            resume="auto",
            **tune_env,
        )
    said = str(held.value)
    assert f"`popflow resume --force-takeover {experiment.url}` once it committed" in said
    assert "If that driver is gone: run again after " in said
    frames = traceback.extract_tb(held.value.__traceback__)
    assert len(frames) <= 3, traceback.format_tb(held.value.__traceback__)
    logs = run_logs("held-lease")
    assert [m for m in logs if m.startswith("LeaseHeldError: ")] == [f"LeaseHeldError: {said}"]
    assert not [m for m in logs if "Traceback" in m], logs
    (flow_run,) = tune_runs("held-lease")
    assert flow_run.state_name == "Failed"


def usurped(config: dict) -> None:
    """Reports five iterations; after the first, a newer driver's lease appears in the
    experiment (as after this driver stalled past its lease and another took over)."""
    from popflow import report
    from popflow.infra.storage.folder import Storage
    from popflow.infra.store.layout import lease_path

    for i in range(1, 6):
        if i == 2:
            lease = '{"epoch": 99, "expires": 4e9}'
            Storage(config["experiment"]).create_text(lease, lease_path(99))
        report({"score": i})


def test_a_lost_lease_is_one_line_too(tune_env):
    """LeaseLost (a newer driver took over) is no bug to trace either: the caller gets it
    without popflow's frames and the flow run's log says it in one line (it logged the
    training's traceback, ~40 lines, found by issue 43's adversarial pass)."""
    import traceback

    from support.prefect_api import run_logs

    from popflow import run
    from popflow.infra.storage.folder import Storage
    from popflow.infra.store.lease import LeaseLost

    experiment = Storage(tune_env["storage"]).child("lost-lease")
    with pytest.raises(LeaseLost) as lost:
        run(usurped, {"experiment": experiment.url}, metric="score", mode="max",
            name="lost-lease", **tune_env)  # fmt: skip
    frames = traceback.extract_tb(lost.value.__traceback__)
    assert len(frames) <= 3, traceback.format_tb(lost.value.__traceback__)
    said = f"LeaseLost: {lost.value}"
    logs = run_logs("lost-lease")
    assert [m for m in logs if m.startswith("LeaseLost: ")] == [said], logs
    assert not [m for m in logs if "Traceback" in m or "the training raised" in m], logs
