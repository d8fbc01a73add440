"""Where segments run: the Dask runner pool, and the simulated backend on a virtual clock."""
