"""The ``tune`` flow run's heartbeats are popflow's: Prefect's engine sends none for it
(its thread slept in 1 s steps and the run's end waited 0.5-1 s for it), and popflow's
thread stops at once. That the heartbeats reach the server: ``test_prefect_record``."""

from __future__ import annotations

import threading

import pytest

from popflow.flows.record.heartbeat import engine_heartbeats_off, heartbeats


def _beating() -> bool:
    return any(t.name == "popflow-flow-heartbeat" for t in threading.enumerate())


@pytest.mark.unit
def test_the_engine_sends_none_and_the_users_interval_is_kept():
    from prefect.settings import (
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        get_current_settings,
        temporary_settings,
    )

    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 45}):
        with engine_heartbeats_off() as every:
            assert every == 45
            assert get_current_settings().flows.heartbeat_frequency is None
        assert get_current_settings().flows.heartbeat_frequency == 45
    with (
        temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}),
        engine_heartbeats_off() as every,
    ):
        assert every is None  # the user turned them off: popflow sends none either


@pytest.mark.integration
def test_the_heartbeat_thread_runs_within_the_flow_run_and_stops_at_once(prefect_server):
    """An interval of an hour: a thread that slept through it would hold the flow's end."""
    from prefect import flow

    seen: list[bool] = []

    @flow(name="heartbeat-check")
    def beating() -> None:
        with heartbeats(3600):
            seen.append(_beating())

    beating()
    assert seen == [True]
    assert not _beating()


@pytest.mark.unit
def test_no_heartbeat_outside_a_flow_run():
    with heartbeats(30):
        assert not _beating()  # no flow run to beat for
    assert not _beating()
