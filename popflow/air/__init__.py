"""Ray's ``ray.air`` namespace, as far as popflow has it: ``popflow.air.integrations``."""
