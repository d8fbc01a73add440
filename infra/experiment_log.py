"""The experiment's commit log: storage is the single source of truth.

Each commit is one JSON object ``.popflow/commits/NNNNNNNN.json`` published
atomically. A commit holds the full state needed to continue (trial table,
scheduler state, RNG states, committed sizes of the derived log files) plus
the results and events of that round. A round is committed or it did not
happen: anything written for an uncommitted round is cut back or ignored when
the experiment is read again.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from popflow.infra.jsonutil import dumps
from popflow.infra.storage import Storage

logger = logging.getLogger(__name__)

LOG_DIR = ".popflow"
COMMITS = f"{LOG_DIR}/commits"
EXPERIMENT_FILE = f"{LOG_DIR}/experiment.json"


class ExperimentLog:
    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.seq = 0

    def commit_path(self, seq: int) -> str:
        return f"{COMMITS}/{seq:08d}.json"

    def write_experiment(self, info: dict[str, Any]) -> None:
        self.storage.write_text(dumps(info, indent=2, sort_keys=True), EXPERIMENT_FILE)

    def commit(self, payload: dict[str, Any]) -> int:
        """Publish the next commit; returns its sequence number."""
        self.seq += 1
        self.storage.write_text(
            dumps({"seq": self.seq, **payload}), self.commit_path(self.seq), durable=True
        )
        return self.seq

    def commit_numbers(self) -> list[int]:
        names = self.storage.listdir(COMMITS)
        return sorted(
            int(n.split(".")[0]) for n in names if n.endswith(".json") and n[:8].isdigit()
        )

    def read(self, seq: int) -> dict[str, Any]:
        return json.loads(self.storage.read_bytes(self.commit_path(seq)))

    def latest(self) -> dict[str, Any] | None:
        """The newest readable commit (None for a new experiment)."""
        for seq in reversed(self.commit_numbers()):
            try:
                commit = self.read(seq)
            except ValueError as e:  # a torn write never publishes, but be safe; a storage
                # error must propagate: skipping a commit would resume from an older one
                logger.warning("skipping unreadable commit %s: %s", seq, e)
                continue
            self.seq = seq
            return commit
        return None
