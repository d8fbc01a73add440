"""A process that holds an experiment's lease, as a driver would, until it is killed."""

from __future__ import annotations

import subprocess
import sys

#: Takes the lease of the experiment at ``argv[1]`` for 600 s, says ``held``, and waits.
SCRIPT = (
    "import sys, time; from popflow.infra.store.lease import Lease; "
    "from popflow.infra.storage.folder import Storage; "
    "Lease(Storage(sys.argv[1]), ttl_s=600).acquire(); print('held', flush=True); "
    "time.sleep(600)"
)


def hold_lease(path: str) -> subprocess.Popen:
    """Start a process that holds ``path``'s lease; it has it once it says ``held``."""
    return subprocess.Popen([sys.executable, "-c", SCRIPT, path], stdout=subprocess.PIPE, text=True)
