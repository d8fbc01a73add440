"""What the console says while a run goes (issue 43, items 8d and 9): the trials in flight
show RUNNING."""

from __future__ import annotations

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
