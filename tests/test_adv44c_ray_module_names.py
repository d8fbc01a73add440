"""Ray 2.60 keeps the allocation functions in ``ray.tune.schedulers.resource_changing_scheduler``
(``ray.tune.schedulers`` does not export ``DistributeResources``), so a Ray user's script
imports them from there; with only ``ray`` changed to ``popflow`` that import must work."""

from __future__ import annotations

import importlib

import pytest

pytestmark = pytest.mark.unit


def test_the_allocation_functions_import_from_rays_module() -> None:
    module = importlib.import_module("popflow.tune.schedulers.resource_changing_scheduler")
    from popflow.tune.schedulers import ResourceChangingScheduler

    assert module.ResourceChangingScheduler is ResourceChangingScheduler
    for name in ("DistributeResources", "DistributeResourcesToTopJob"):
        assert callable(getattr(module, name))
