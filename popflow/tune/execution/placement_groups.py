"""Ray's ``ray.tune.execution.placement_groups``: :class:`PlacementGroupFactory`."""

from popflow.schedulers.placement import PlacementGroupFactory

__all__ = ["PlacementGroupFactory"]
