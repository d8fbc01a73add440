"""The Prefect record of a run: the tune flow, round task runs, artifacts, deployable flows."""
