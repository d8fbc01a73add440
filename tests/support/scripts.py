"""The environment of a script a test runs as a user would, on the embedded default."""

from __future__ import annotations

import os
from pathlib import Path

from support import leftovers


def embedded_env(home: Path | str, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (this process's environment by default) without its ``PREFECT_`` settings
    (the session's server among them), so that a script runs on popflow's embedded
    default, in the Prefect home ``home`` (``PREFECT_HOME``): the test's own (under its
    ``tmp_path``) or the suite's (the ``prefect_home`` fixture).

    There is no default: without ``PREFECT_HOME`` a script falls back to ``~/.prefect``,
    and starts a server that writes the suite's runs into the user's database (issue 48).
    The user's own home is refused too.
    """
    if home is None or not str(home):
        raise ValueError(
            "embedded_env needs a Prefect home (the test's tmp_path, or the suite's "
            "prefect_home fixture): without one a script writes into ~/.prefect"
        )
    home = Path(home).expanduser()
    if leftovers.is_users_prefect_home(home):
        raise ValueError(f"embedded_env's home {str(home)!r} is the user's own Prefect home")
    out = {
        k: v
        for k, v in (os.environ if env is None else env).items()
        if not leftovers.is_prefect_setting(k)
    }
    out["PREFECT_HOME"] = str(home)
    out.update(leftovers.marks())  # what the script starts stays known to the suite's sweep
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
