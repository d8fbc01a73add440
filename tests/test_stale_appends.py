"""A driver stopped inside a derived-log append wakes after a newer driver finished the
experiment: what it writes then must change nothing anyone reads (issue 46, break 1).

Driver A is stopped (SIGSTOP) inside a ``result.json`` append, after its lease check and
after the append's own checks, its bytes not yet written; B takes the lapsed lease and
runs the experiment to the end; A wakes. The append is one of the run's last lines, which
the driver's main thread waits for before its final commit: so A's writer thread, not a
LeaseLost in the main thread, acts first when A wakes. Before the fence A's line landed
after B's (a trial's log read ``1..24, 24``; 1 of 6 times in the issue, when the stall
fell where the main thread could exit first)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from support.driving import DRIVER, drive, read_experiment
from support.polling import wait_for
from test_fault_sequences import KEEP_2, _state, contiguous, iterations

from popflow.infra.storage.folder import Storage
from popflow.infra.store.lease import lease_holder

pytestmark = pytest.mark.system


def test_a_driver_stopped_inside_an_append_adds_nothing_when_it_wakes(prefect_server, tmp_path):
    storage, experiment = str(tmp_path), str(tmp_path / "exp")
    cmd = [sys.executable, DRIVER, storage, "exp", "pbt_synch", *KEEP_2, "--lease-ttl", "3"]
    a = subprocess.Popen(
        [*cmd, "--kill-at", "stop-in-append:24"],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    b = None
    try:
        wait_for(lambda: _state(a.pid) == "T", 120, "A did not stop inside an append")
        wait_for(lambda: lease_holder(Storage(experiment)) is None, 120, "A's lease did not lapse")
        b = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        os.kill(a.pid, signal.SIGCONT)
        _, a_err = a.communicate(timeout=300)
    finally:
        if a.poll() is None:
            os.killpg(a.pid, signal.SIGKILL)
    assert b.returncode == 0, b.stderr[-3000:]
    assert a.returncode != 0 and "LeaseLost" in a_err, a_err[-3000:]
    assert contiguous(experiment, 24), iterations(experiment)
    drive(f"{storage}-ref", "exp", "pbt_synch", extra=KEEP_2)
    assert read_experiment(experiment) == read_experiment(f"{storage}-ref/exp")
