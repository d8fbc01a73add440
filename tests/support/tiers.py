"""The test tiers: every test is exactly one of ``unit``, ``integration``, ``system``,
``hosts``.

- ``unit``: no processes, no sockets; runs in milliseconds (``make test-fast``).
- ``integration``: a Dask cluster, moto's S3 server or a Prefect server.
- ``system``: subprocess drivers, kills, deployments, ``make demo``.
- ``hosts``: popflow on several simulated machines (network namespaces, a scratch folder
  per host: :mod:`support.hosts`); needs root (``make test-hosts`` runs these alone).

A test with no tier or two fails at collection, so a new one cannot go untiered; a
``unit`` test that opens a socket or starts a process fails with :class:`NotAUnitTest`.
A pytest plugin: ``tests/conftest.py`` loads it.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import socket
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import pytest

TIERS = ("unit", "integration", "system", "hosts")


class NotAUnitTest(RuntimeError):
    """A ``unit`` test tried to reach outside its process."""


def tiers_of(item: pytest.Item) -> list[str]:
    """The tiers ``item`` is marked with (by module, class or the test itself)."""
    return sorted({m.name for m in item.iter_markers() if m.name in TIERS})


def untiered(items: list[pytest.Item]) -> list[str]:
    """One line for each test that has no tier or more than one."""
    bad = []
    for item in items:
        found = tiers_of(item)
        if len(found) != 1:
            bad.append(f"{item.nodeid}: {', '.join(found) or 'no tier'}")
    return bad


def _refuse(what: str) -> Callable[..., Any]:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise NotAUnitTest(
            f"a `unit` test must not {what}: mark it `integration` (a cluster, moto, a "
            "Prefect server) or `system` (subprocesses) instead (tests/support/tiers.py)"
        )

    return refused


def forbid_the_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make connecting a socket or starting a process fail for the rest of the test."""
    monkeypatch.setattr(socket.socket, "connect", _refuse("connect a socket"))
    monkeypatch.setattr(socket.socket, "connect_ex", _refuse("connect a socket"))
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse("start a subprocess"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", _refuse("start a process"))


def pytest_configure(config: pytest.Config) -> None:
    """matplotlib builds its font cache the first time it is imported on a machine, and
    runs ``fc-list`` to do it: done here, before any test, so that the first unit test
    that draws on a fresh machine is not failed for starting a process."""
    with contextlib.suppress(ImportError):  # without the plots extra nothing draws
        import matplotlib.font_manager  # noqa: F401


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test has exactly one tier (``unit``, ``integration``, ``system``)."""
    bad = untiered(items)
    if bad:
        raise pytest.UsageError(
            "each test needs exactly one tier marker (unit, integration, system, hosts; "
            "tests/support/tiers.py):\n  " + "\n  ".join(bad)
        )


@pytest.fixture(autouse=True)
def _unit_tests_stay_inside(request: pytest.FixtureRequest) -> Iterator[pytest.MonkeyPatch]:
    """A ``unit`` test that opens a socket or starts a process fails, saying so; the
    value's ``undo()`` lifts that (the tiers' own tests do, to check an inner session)."""
    with pytest.MonkeyPatch.context() as guard:
        if request.node.get_closest_marker("unit") is not None:
            forbid_the_outside(guard)
        yield guard
