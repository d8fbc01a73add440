"""Ray's ``ray.air.integrations``: ``popflow.air.integrations.mlflow``."""
