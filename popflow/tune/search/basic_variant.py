"""``ray.tune.search.basic_variant``: random and grid search."""

from popflow.schedulers.search import BasicVariantGenerator

__all__ = ["BasicVariantGenerator"]
