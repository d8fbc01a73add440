"""The embedded cluster's Dask dashboard listens on 127.0.0.1 only, like its scheduler: a
run on a laptop or a shared host shows its trials to nobody else on the network."""

from __future__ import annotations

import socket
from typing import Any

import distributed
import psutil
import pytest

from popflow import run, tune

pytestmark = pytest.mark.integration


def listening_hosts(port: int) -> set[str]:
    """The addresses this process listens on at ``port`` (the embedded scheduler, with its
    dashboard, lives in the driver's process)."""
    return {
        c.laddr.ip
        for c in psutil.Process().net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    }


def answers(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError:
        return False
    return True


class DashboardProbe(tune.Callback):
    """Looks at the dashboard of the cluster the run uses, once, while it runs."""

    def __init__(self) -> None:
        self.seen: dict[str, Any] = {}

    def setup(self, **info: Any) -> None:
        client = distributed.default_client()
        port = client.scheduler_info()["services"]["dashboard"]
        self.seen = {
            "link": client.dashboard_link,
            "hosts": listening_hosts(port),
            # all of 127.0.0.0/8 is this machine: a socket bound to every interface
            # answers on 127.0.0.2 too, one bound to 127.0.0.1 does not
            "loopback": answers("127.0.0.1", port),
            "other address": answers("127.0.0.2", port),
        }


def one_report(config: dict[str, Any]) -> None:
    tune.report({"score": 1})


def test_the_embedded_dashboard_listens_on_loopback_only(prefect_server, tmp_path):
    probe = DashboardProbe()
    results = run(one_report, storage=str(tmp_path), name="dash", n_workers=1, callbacks=[probe])
    assert [r.status for r in results] == ["TERMINATED"]
    assert probe.seen["link"].startswith("http://127.0.0.1:")
    assert probe.seen["hosts"] == {"127.0.0.1"}
    assert probe.seen["loopback"] is True
    assert probe.seen["other address"] is False
