"""Ray's ``ray.tune.execution`` package: only its placement groups."""
