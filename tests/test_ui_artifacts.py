"""What the Prefect UI's Artifacts page shows of a run (issue 43, item 8): the plots at the
end of every run, short ones too, and a leaderboard version for each committed round."""

from __future__ import annotations

import threading

import pytest
from support.parity import parity_run
from support.prefect_api import artifacts, run_logs

from popflow.flows.record import artifacts as run_artifacts
from popflow.flows.record.artifacts import RunArtifacts
from popflow.flows.record.plot_artifacts import PlotRefresh

pytestmark = pytest.mark.integration


def test_a_run_under_a_minute_ends_with_its_plots_and_a_leaderboard_per_round(tune_env):
    """Each round task run says the best result so far. Before, a run shorter than ``PLOTS_INTERVAL_S`` drew no plots, and rounds that came
    while the leaderboard was being sent were coalesced (a 6-round demo had versions for
    rounds 1, 4, 5, 6)."""
    parity_run([10, 20, 40, 30], iterations=6, name="short-ui", **tune_env)
    (plots,) = artifacts("short-ui-plots")  # drawn once, at the end
    assert "data:image/png;base64," in plots.data
    assert "as of round 6" in plots.description
    boards = artifacts("short-ui-leaderboard")
    rounds = [b.description.split("after round ")[1].split(",")[0] for b in boards]
    assert rounds == ["1", "2", "3", "4", "5", "6"], rounds
    # each round task run's summary line says the best result so far (issue 43, 8c)
    said = [m for m in run_logs("short-ui") if " committed: " in m]
    assert len(said) == 6, said
    for n, line in enumerate(said, 1):
        assert line.startswith(f"round {n} committed: 4 results; best mean_accuracy "), said
        assert f", iter {n}); trials " in line, said


def test_rounds_waiting_for_the_api_each_get_their_version(prefect_server, monkeypatch):
    """Rounds committed while the API is busy with an earlier one are each sent, in order;
    past ``MAX_BACKLOG`` waiting, the oldest are skipped and the newest always sent."""
    monkeypatch.setattr(run_artifacts, "MAX_BACKLOG", 4)
    from prefect import artifacts as prefect_artifacts

    real, release = prefect_artifacts.create_table_artifact, threading.Event()

    def slow_first(*args, **kwargs):
        if "after round 1," in kwargs.get("description", ""):
            release.wait(30)  # the API is slow with round 1 while rounds 2 to 9 commit
        return real(*args, **kwargs)

    monkeypatch.setattr(prefect_artifacts, "create_table_artifact", slow_first)
    board = RunArtifacts("backlog", "score", "max")
    for round_no in range(1, 10):
        board.round_rows([{"trial": "t", "score": str(round_no)}], 10.0 * round_no, round_no)
    release.set()
    board.final_text("# done", "done")
    sent = [b.description for b in artifacts("backlog-leaderboard")]
    assert sent == [f"backlog after round {n}, best first" for n in (1, 6, 7, 8, 9)], sent
    assert board.skipped == 4


def test_the_final_drawing_waits_for_nothing_but_itself(prefect_server):
    """A run that ended before any redrawing was due still gets its one drawing at the end,
    after the warm-up (matplotlib's import) that ran while it trained."""
    calls: list[str] = []
    refresh = PlotRefresh(
        "once",
        "/nowhere",
        None,
        interval_s=3600.0,
        draw=lambda *a: calls.append("draw") is None,
        warm=lambda: calls.append("warm"),
    )
    board = RunArtifacts("once", "score", "max", plots=refresh)
    board.round_rows([{"trial": "t", "score": "1"}], 100.0, 1)
    board.final_text("# done", "done")
    assert calls == ["warm", "draw"] and refresh.drawn == 1
