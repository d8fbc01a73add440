"""The recovery matrix's trainable (tests/test_recovery_matrix.py), imported by the flow-run
processes a Prefect worker starts and by their Dask workers."""

from __future__ import annotations

import os
import time
from typing import Any

from trainables import ParityTrainable

#: The folder of a case's gate, from the flow run's environment (its job variables).
GATE_ENV = "POPFLOW_TEST_GATE"


class EnvGatedTrainable(ParityTrainable):
    """ParityTrainable that stops at iteration ``config["gate_at"]`` while the folder
    ``$POPFLOW_TEST_GATE`` has no file ``open``, after creating ``reached`` there: a test
    kills the driver at a known point. The folder comes from the environment, not the
    config, so that every case's experiment has the config of the uninterrupted run;
    unset, the trainable never stops."""

    def step(self) -> dict[str, Any]:
        folder = os.environ.get(GATE_ENV)
        if folder and self.iteration + 1 == self.config["gate_at"]:
            opened = os.path.join(folder, "open")
            if not os.path.exists(opened):
                with open(os.path.join(folder, "reached"), "w"):
                    pass
                while not os.path.exists(opened):
                    time.sleep(0.05)  # a file the test creates; nothing else to wait on
        return super().step()
