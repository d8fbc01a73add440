"""Ray's ``ray.is_initialized`` and ``ray.shutdown`` over what :func:`popflow.init` and
:func:`popflow.put` set up in this process."""

from __future__ import annotations

from popflow.flows.api.tuner import _CLUSTER
from popflow.infra.cluster.dask_cluster import use_cores
from popflow.tasks.object_refs import drop_all, held

__all__ = ["is_initialized", "shutdown"]


def is_initialized() -> bool:
    """Ray's ``ray.is_initialized``: :func:`popflow.init` was called, or a value was put
    (Ray's ``put`` starts Ray), and :func:`shutdown` has not ended it since."""
    return _CLUSTER.initialized or bool(held())


def shutdown() -> None:
    """Ray's ``ray.shutdown``: forget what :func:`popflow.init` chose (the next run uses
    the defaults) and every value put in this process (its refs no longer resolve)."""
    _CLUSTER.address = None
    _CLUSTER.initialized = False
    use_cores(None, None)
    drop_all()
