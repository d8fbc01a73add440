"""``ray.tune.utils``: the helpers Ray Tune's own examples use."""
