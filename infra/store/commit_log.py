"""The experiment's commit log: storage is the single source of truth.

Each commit is one object ``.popflow/commits/NNNNNNNN.json``, created only if
absent (so two drivers can never both write commit N) and durable once
written. Its first line is the commit as JSON, its second the SHA-256 of
that line: a commit that is torn, garbage, empty or edited by hand fails the
check and is *damaged*. A commit holds its round (results, events, exploit
lines, the checkpoints it retired), the epoch of the lease its writer held
(:mod:`popflow.infra.store.lease`), and the state needed to continue (trial
table, scheduler and RNG states, committed sizes of the derived logs): in
full (a *snapshot*), or as its difference from the commit before (a *delta*,
:mod:`popflow.infra.store.json_delta`), so a commit costs what its round changed.
A snapshot is written when the deltas since the last one add up to its
size: the bytes written stay linear in the results, and reading a state
back reads at most about twice a snapshot. Commits before a snapshot are
deleted once the commit after it is durable and the derived logs hold their
lines (see :meth:`ExperimentLog._prune`).

A round is committed or it did not happen: anything written for an
uncommitted round is cut back or ignored when the experiment is read again.
Retention keeps what the commit before the newest references, so reading
falls back over one damaged newest commit; more than that is an error.

A pruned number is never free again where a stale driver could reach it. Create-only
fences a driver that was taken over only while the number it would write next exists:
such a driver's next commit is numbered right after the commit it last wrote or
resumed from, which is always some driver's *first* commit (the number the driver
that took over wrote first). So each driver's first commit number is a *fence*
(the state's ``fences``, while it is kept): pruned, its file is overwritten with a
tombstone (a commit that says ``"pruned": true``) and marked
(:func:`~popflow.infra.store.layout.pruned_path`), never deleted, and a stale
driver's create there fails, on local disk and on S3 alike (``If-None-Match``).
Readers list only the unmarked numbers. Commits written before fences existed carry
none: a driver that resumes such a log takes every commit it finds as a fence.
"""

from __future__ import annotations

import hashlib
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from popflow.infra.jsonutil import dumps
from popflow.infra.storage.folder import Storage
from popflow.infra.store.json_delta import patch
from popflow.infra.store.layout import (
    COMMITS,
    EXPERIMENT_FILE,
    commit_path,
    commit_seqs,
    pruned_path,
    pruned_seqs,
)
from popflow.infra.store.lease import LeaseLost
from popflow.infra.store.state_text import StateText

logger = logging.getLogger(__name__)

#: What a commit carries forward (in full in a snapshot, as a delta otherwise);
#: everything else in a commit is about its own round.
STATE_KEYS = (
    "trials",
    "scheduler",
    "decisions",
    "derived",
    "policy_total",
    "stopper",
    "callbacks",
    "search",
    "search_calls",
    "fences",
    "attempt_rounds",  # popflow.flows.experiment.round_history.KEY
)
#: Deltas after which a snapshot is written even if they are small: bounds the
#: objects a resume reads.
MAX_DELTAS = 1000


class CommitConflict(LeaseLost):
    """Another driver wrote the commit this one was about to write."""

    def __init__(self, message: str, epoch: int | None) -> None:
        super().__init__(message)
        self.epoch = epoch  # the other writer's lease epoch (None: unreadable)


class DamagedCommit(ValueError):
    """A commit fails its check (torn, garbage, or edited by hand)."""

    def __init__(self, message: str, seq: int | None = None) -> None:
        super().__init__(message if seq is None else f"commit {seq}: {message}")
        self.seq = seq


class PrunedCommit(DamagedCommit):
    """The commit was pruned: its file is a tombstone that keeps its number taken."""

    def __init__(self, seq: int, epoch: int | None) -> None:
        super().__init__("it was pruned (a tombstone)", seq)
        self.epoch = epoch  # the lease epoch of the driver that pruned it


class DamagedLog(RuntimeError):
    """The commit log cannot be read back to a state to resume from."""


def encode_commit(commit: dict[str, Any], state: str | None = None) -> bytes:
    """A commit's bytes; ``state``: the JSON text of its ``state`` (a snapshot's), joined
    in as it is rather than encoded again."""
    body = dumps(commit)
    if state is not None:
        body = f'{body[:-1]}, "state": {state}}}'
    digest = hashlib.sha256(body.encode()).hexdigest()
    return f"{body}\n{digest}\n".encode()


def tombstone(seq: int, epoch: int) -> bytes:
    """What a pruned fence's file holds (see the module's doc); ``epoch``: the pruner's."""
    return encode_commit({"seq": seq, "epoch": epoch, "pruned": True})


def decode_commit(data: bytes) -> dict[str, Any]:
    """The commit object in ``data`` (a snapshot or a delta, see :meth:`ExperimentLog.read`
    for the state); :class:`DamagedCommit` if it fails its check, :class:`PrunedCommit`
    if it is a tombstone."""
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
    if not isinstance(commit, dict) or not isinstance(commit.get("seq"), int):
        raise DamagedCommit("not a commit")
    if commit.get("pruned") is True:
        epoch = commit.get("epoch")
        raise PrunedCommit(commit["seq"], epoch if isinstance(epoch, int) else None)
    state = commit.get("state")
    snapshot = isinstance(state, dict) and isinstance(state.get("trials"), list)
    if not snapshot and not (isinstance(commit.get("base"), int) and "delta" in commit):
        raise DamagedCommit("neither a snapshot nor a delta")
    return commit


@dataclass(frozen=True)
class Latest:
    """The commit to continue from; ``damaged``: the newer one that failed its check."""

    commit: dict[str, Any]
    damaged: int | None = None


class ExperimentLog:
    """Writes and reads the commits of one experiment (one driver writes, under its lease)."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.seq = 0
        self.epoch = 0  # the lease epoch this driver writes under (0: not writing)
        self._state: StateText | None = None  # the state of commit ``seq``
        self._base = 0  # the snapshot the next delta builds on
        self._snapshot_bytes = 0
        self._delta_bytes = 0  # written since that snapshot
        self._deltas = 0
        self._known: set[int] = set()  # commit numbers in storage (not yet pruned)
        self._snapshot = 0  # the newest snapshot
        self._logs_through = 0  # the derived logs hold the lines of the commits up to this
        #: kept commits that are a driver's first: pruned to tombstones, never deleted
        self._fences: set[int] = set()
        self._wrote = False  # this log has written a commit (its first is a fence)

    @property
    def state(self) -> dict[str, Any] | None:
        """The state of the newest commit this log wrote (as JSON reads it; None: none)."""
        return None if self._state is None else self._state.value()

    def write_experiment(self, info: dict[str, Any]) -> None:
        self.storage.write_text(dumps(info, indent=2, sort_keys=True), EXPERIMENT_FILE)

    def snapshot_due(self) -> bool:
        """The next commit will be a snapshot."""
        return (
            self._state is None
            or self._delta_bytes >= self._snapshot_bytes
            or self._deltas >= MAX_DELTAS
        )

    def commit(
        self, payload: dict[str, Any], snapshot: bool | None = None, logs_through: int | None = None
    ) -> int:
        """Publish the next commit; returns its sequence number.

        ``payload``: the state (:data:`STATE_KEYS`) and the round's own fields; a
        large part of the state may be given as :class:`~popflow.infra.store.json_delta.Changed`
        (its items that changed since the last commit), except in a first commit.
        ``snapshot``: write the state in full (None: when :meth:`snapshot_due`).
        ``logs_through``: the newest commit whose lines the derived logs hold within
        this commit's ``derived`` sizes (None: this one); the commits after it are
        kept for a resume to append their lines from.
        Raises :class:`LeaseLost` if another driver wrote that commit (its
        lease is newer: this driver must stop).
        """
        seq = self.seq + 1
        given = {k: payload[k] for k in STATE_KEYS if k in payload}
        fences = self._fences if self._wrote else self._fences | {seq}
        given["fences"] = sorted(fences)
        if self._state is None:
            state, delta = StateText(STATE_KEYS, given), None
        else:
            state, delta = self._state.update(given)
        record = {k: v for k, v in payload.items() if k not in STATE_KEYS}
        record.update(seq=seq, epoch=self.epoch)
        full = self.snapshot_due() if snapshot is None else snapshot
        if full or self._state is None:
            data = encode_commit(record, state.json())
        else:
            record.update(base=self._base, delta=delta)
            data = encode_commit(record)
        if not self.storage.create_bytes(data, commit_path(seq), durable=True):
            other = self._epoch_of(seq)
            raise CommitConflict(
                f"commit {seq} of {self.storage.url} was written by driver epoch {other}, "
                f"not by this one (epoch {self.epoch}): another driver took the experiment over",
                other,
            )
        self.seq, self._state = seq, state
        self._known.add(seq)
        self._fences, self._wrote = fences, True
        # with what held before this commit: a resume may fall back to the one before it
        self._prune()
        self._logs_through = max(self._logs_through, seq if logs_through is None else logs_through)
        if "delta" not in record:
            self._base, self._snapshot_bytes, self._delta_bytes, self._deltas = seq, len(data), 0, 0
            self._snapshot = seq
        else:
            self._delta_bytes += len(data)
            self._deltas += 1
        return seq

    def _prune(self) -> None:
        """Delete what no resume needs, now that a newer commit is durable: commits before
        the snapshot it builds on whose lines the commit before it has in the logs.

        A resume continues from the newest commit or the one before (if the newest is
        damaged): it reads at most the snapshot either builds on, and appends to the
        logs (cut back to that commit's sizes) only lines of later commits.
        """
        doomed = sorted(s for s in self._known if s < self._snapshot and s <= self._logs_through)
        if not doomed:
            return
        fenced = [s for s in doomed if s in self._fences]
        try:
            for s in fenced:  # marked first: a reader never lists a tombstone
                self.storage.write_bytes(b"", pruned_path(s))
                self.storage.write_bytes(tombstone(s, self.epoch), commit_path(s))
            self.storage.remove_files([commit_path(s) for s in doomed if s not in self._fences])
        except Exception as exc:  # old commits are garbage, not data: the run goes on
            logger.warning("could not delete old commits of %s: %s", self.storage.url, exc)
            return
        self._known.difference_update(doomed)
        self._fences = self._fences.difference(fenced)

    def _epoch_of(self, seq: int) -> int | None:
        try:
            return self.read_record(seq).get("epoch")
        except PrunedCommit as e:
            return e.epoch
        except (DamagedCommit, FileNotFoundError):
            return None

    def commit_numbers(self) -> list[int]:
        """The numbers of the commits in storage, oldest first (not the pruned ones whose
        tombstones keep their numbers taken)."""
        names = self.storage.listdir(COMMITS)
        pruned = set(pruned_seqs(names))
        return [n for n in commit_seqs(names) if n not in pruned]

    def read_record(self, seq: int) -> dict[str, Any]:
        """Commit ``seq`` as stored: its round's own fields, and its state or delta."""
        try:
            record = decode_commit(self.storage.read_bytes(commit_path(seq)))
        except PrunedCommit:
            raise
        except DamagedCommit as e:
            raise DamagedCommit(str(e), seq) from None
        if record["seq"] != seq:
            raise DamagedCommit(f"it says it is commit {record['seq']}", seq)
        return record

    def _read_records(self, seqs: list[int]) -> list[dict[str, Any]]:
        if self.storage.is_local or len(seqs) < 4:
            return [self.read_record(s) for s in seqs]
        with ThreadPoolExecutor(max_workers=16) as pool:  # a network round trip each
            return list(pool.map(self.read_record, seqs))

    def read(self, seq: int) -> dict[str, Any]:
        """Commit ``seq`` with the state it leaves (its snapshot's, with the deltas up to it
        applied): ``trials``, ``scheduler``, ... and its round's fields.

        :class:`DamagedCommit` if it, or a commit it builds on, fails its check.
        """
        record = self.read_record(seq)
        if "state" in record:
            state = record.pop("state")
        else:
            base = record["base"]
            chain = self._read_records(list(range(base, seq)))
            if "state" not in chain[0]:
                raise DamagedCommit(f"commit {seq} builds on {base}, which is no snapshot", seq)
            state = chain[0]["state"]
            for step in [*chain[1:], record]:
                if step.get("base") != base:
                    raise DamagedCommit(f"it does not build on snapshot {base}", step["seq"])
                state = patch(state, step["delta"])
            del record["base"], record["delta"]
        return {**record, **state}

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
        for _ in range(3):
            try:
                return self._find_latest()
            except (FileNotFoundError, PrunedCommit):  # pruned meanwhile: list again
                continue
        return self._find_latest()

    def _find_latest(self) -> Latest | None:
        numbers = self.commit_numbers()
        self._known = set(numbers)
        if not numbers:
            return None
        newest = numbers[-1]
        try:
            commit = self.read(newest)
        except PrunedCommit:
            raise
        except DamagedCommit as e:
            first = e
        else:
            self.seq = newest
            self._fences = _fences_of(commit, numbers)
            return Latest(commit)
        if first.seq != newest:
            raise DamagedLog(
                f"commit {first.seq} of {self.storage.url}, which commit {newest} builds on, is "
                f"damaged ({first}); popflow falls back over a damaged newest commit only, and "
                "nothing was changed"
            )
        if len(numbers) < 2:
            raise DamagedLog(
                f"commit {newest} of {self.storage.url} is damaged ({first}) and there is no "
                "earlier one to fall back to; nothing was changed"
            )
        previous = numbers[-2]
        try:
            commit = self.read(previous)
        except PrunedCommit:
            raise
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
        # the damaged one may have been a driver's first, its fences unreadable
        self._fences = _fences_of(commit, numbers) | {newest}
        return Latest(commit, damaged=newest)


def _fences_of(commit: dict[str, Any], numbers: list[int]) -> set[int]:
    """The fences among the kept commit ``numbers`` that ``commit`` (resumed from) names;
    a commit written before fences existed names none: every kept commit counts as one."""
    fences = commit.get("fences")
    if not isinstance(fences, list):
        return set(numbers)
    return set(numbers).intersection(fences)
