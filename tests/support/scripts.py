"""The environment of a script a test runs as a user would, on the embedded default."""

from __future__ import annotations

import os
from pathlib import Path


def embedded_env(
    home: Path | str | None = None, env: dict[str, str] | None = None
) -> dict[str, str]:
    """``env`` (this process's environment by default) without its ``PREFECT_`` settings
    (the session's server among them), so that a script runs on popflow's embedded
    default; with ``home``, in a Prefect home of its own (``PREFECT_HOME``)."""
    out = {
        k: v
        for k, v in (os.environ if env is None else env).items()
        if not k.startswith("PREFECT_")
    }
    if home is not None:
        out["PREFECT_HOME"] = str(home)
    return out
