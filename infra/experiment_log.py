"""The experiment's commit log: storage is the single source of truth.

Each commit is one object ``.popflow/commits/NNNNNNNN.json``, created only if
absent (so two drivers can never both write commit N) and durable once
written. Its first line is the commit as JSON, its second the SHA-256 of
that line: a commit that is torn, garbage, empty or edited by hand fails the
check and is *damaged*. A commit holds the full state needed to continue
(trial table, scheduler state, RNG states, committed sizes of the derived
log files), the results and events of its round, and the epoch of the lease
its writer held (:mod:`popflow.infra.lease`).

A round is committed or it did not happen: anything written for an
uncommitted round is cut back or ignored when the experiment is read again.
Retention keeps what the commit before the newest references, so reading
falls back over one damaged newest commit; more than that is an error.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from popflow.infra.jsonutil import dumps
from popflow.infra.lease import LeaseLost
from popflow.infra.storage import Storage

logger = logging.getLogger(__name__)

LOG_DIR = ".popflow"
COMMITS = f"{LOG_DIR}/commits"
EXPERIMENT_FILE = f"{LOG_DIR}/experiment.json"


class CommitConflict(LeaseLost):
    """Another driver wrote the commit this one was about to write."""

    def __init__(self, message: str, epoch: int | None) -> None:
        super().__init__(message)
        self.epoch = epoch  # the other writer's lease epoch (None: unreadable)


class DamagedCommit(ValueError):
    """A commit fails its check (torn, garbage, or edited by hand)."""


class DamagedLog(RuntimeError):
    """The commit log cannot be read back to a state to resume from."""


def encode_commit(commit: dict[str, Any]) -> bytes:
    body = dumps(commit)
    digest = hashlib.sha256(body.encode()).hexdigest()
    return f"{body}\n{digest}\n".encode()


def decode_commit(data: bytes) -> dict[str, Any]:
    """The commit in ``data``; :class:`DamagedCommit` if it fails its check."""
    try:
        body, digest = data.decode("utf-8").rstrip("\n").rsplit("\n", 1)
    except (UnicodeDecodeError, ValueError):
        raise DamagedCommit("no checksum line") from None
    if hashlib.sha256(body.encode()).hexdigest() != digest.strip():
        raise DamagedCommit("its SHA-256 does not match its content")
    try:
        commit = json.loads(body)
    except ValueError as e:
        raise DamagedCommit(f"not JSON: {e}") from None
    if not isinstance(commit, dict) or not isinstance(commit.get("trials"), list):
        raise DamagedCommit("not a commit")
    return commit


@dataclass(frozen=True)
class Latest:
    """The commit to continue from; ``damaged``: the newer one that failed its check."""

    commit: dict[str, Any]
    damaged: int | None = None


class ExperimentLog:
    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.seq = 0
        self.epoch = 0  # the lease epoch this driver writes under (0: not writing)

    def commit_path(self, seq: int) -> str:
        return f"{COMMITS}/{seq:08d}.json"

    def write_experiment(self, info: dict[str, Any]) -> None:
        self.storage.write_text(dumps(info, indent=2, sort_keys=True), EXPERIMENT_FILE)

    def commit(self, payload: dict[str, Any]) -> int:
        """Publish the next commit; returns its sequence number.

        Raises :class:`LeaseLost` if another driver wrote that commit (its
        lease is newer: this driver must stop).
        """
        seq = self.seq + 1
        data = encode_commit({"seq": seq, "epoch": self.epoch, **payload})
        if not self.storage.create_bytes(data, self.commit_path(seq), durable=True):
            other = self._epoch_of(seq)
            raise CommitConflict(
                f"commit {seq} of {self.storage.url} was written by driver epoch {other}, "
                f"not by this one (epoch {self.epoch}): another driver took the experiment over",
                other,
            )
        self.seq = seq
        return seq

    def _epoch_of(self, seq: int) -> int | None:
        try:
            return self.read(seq).get("epoch")
        except (DamagedCommit, FileNotFoundError):
            return None

    def commit_numbers(self) -> list[int]:
        names = self.storage.listdir(COMMITS)
        return sorted(
            int(n.split(".")[0]) for n in names if n.endswith(".json") and n[:8].isdigit()
        )

    def read(self, seq: int) -> dict[str, Any]:
        return decode_commit(self.storage.read_bytes(self.commit_path(seq)))

    def latest(self) -> dict[str, Any] | None:
        """The newest commit (None for a new experiment); see :meth:`find_latest`."""
        found = self.find_latest()
        return None if found is None else found.commit

    def find_latest(self) -> Latest | None:
        """The commit to continue from: the newest, or the one before it if the newest
        is damaged (retention keeps what that one references). A storage error
        propagates: skipping a commit it cannot read would resume from an older one.
        Raises :class:`DamagedLog` when no commit can be used.
        """
        numbers = self.commit_numbers()
        if not numbers:
            return None
        newest = numbers[-1]
        try:
            commit = self.read(newest)
        except DamagedCommit as e:
            first = e
        else:
            self.seq = newest
            return Latest(commit)
        if len(numbers) < 2:
            raise DamagedLog(
                f"commit {newest} of {self.storage.url} is damaged ({first}) and there is no "
                "earlier one to fall back to; nothing was changed"
            )
        previous = numbers[-2]
        try:
            commit = self.read(previous)
        except DamagedCommit as e:
            raise DamagedLog(
                f"commits {previous} and {newest} of {self.storage.url} are both damaged "
                f"({e}; {first}); popflow falls back over one damaged commit only, and "
                "nothing was changed"
            ) from None
        logger.warning(
            "commit %d of %s is damaged (%s); continuing from commit %d",
            newest,
            self.storage.url,
            first,
            previous,
        )
        self.seq = newest  # the next commit goes after the damaged one
        return Latest(commit, damaged=newest)
