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


#: a ``sitecustomize`` that makes importing the named top-level packages fail as if they
#: were not installed
_HIDE = """
import sys

HIDDEN = {hidden!r}


class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)


sys.meta_path.insert(0, Hide())
"""


def hiding(folder: Path, packages: set[str], env: dict[str, str]) -> dict[str, str]:
    """``env`` for a Python in which ``packages`` cannot be imported, installed or not (a
    ``sitecustomize`` written into ``folder``, put first on ``PYTHONPATH``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_HIDE.format(hidden=sorted(packages)))
    path = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))
    return {**env, "PYTHONPATH": path}
