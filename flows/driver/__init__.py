"""The round loop: plan, dispatch, reduce, commit. Emits events; imports no console, Prefect or Dask."""
