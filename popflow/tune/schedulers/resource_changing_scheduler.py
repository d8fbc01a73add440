"""``ray.tune.schedulers.resource_changing_scheduler``: Ray 2.60 keeps the allocation
functions only here (``ray.tune.schedulers`` does not export them), so a Ray script imports
``DistributeResources`` from this module."""

from popflow.schedulers.resource_changing import (
    DistributeResources,
    DistributeResourcesToTopJob,
    ResourceChangingScheduler,
)

__all__ = [
    "DistributeResources",
    "DistributeResourcesToTopJob",
    "ResourceChangingScheduler",
]
