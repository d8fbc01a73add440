"""The Dask cluster: the embedded LocalCluster, GPUs, worker start."""
