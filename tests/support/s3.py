"""Storage on the tests' moto S3 server (the ``s3`` fixture in tests/conftest.py)."""

from __future__ import annotations

from popflow.infra.storage.retry import RetryPolicy

#: Retries that give up in milliseconds, so that a test of failing storage does not wait.
FAST = RetryPolicy(attempts=5, base_delay=0.001, max_delay=0.004, deadline=10.0)
