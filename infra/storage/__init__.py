"""fsspec I/O: local folders and S3, retries, errors, credentials."""
