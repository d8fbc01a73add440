"""Reading an experiment back from storage: the trial table of its last commit.

Whatever was written after the last commit did not happen: derived logs are
cut back to their committed sizes, checkpoints no commit knows are deleted,
and lineage files are rewritten from the committed lineage.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from popflow.flows.controller import TrialRecord, csv_row
from popflow.infra.experiment_log import ExperimentLog
from popflow.infra.jsonutil import dumps
from popflow.infra.storage import Storage
from popflow.schedulers import Trial, TrialStatus
from popflow.tasks.segment import CheckpointRecord

logger = logging.getLogger(__name__)

#: Suffixes of half-published checkpoint folders (see infra.checkpoint_store).
_SCRATCH = (".tmp-", ".old-")


def is_finished(commit: dict[str, Any]) -> bool:
    live = (TrialStatus.PENDING, TrialStatus.RUNNING, TrialStatus.PAUSED)
    return not any(TrialStatus(t["status"]) in live for t in commit["trials"])


def _read_results(storage: Storage, dirname: str, count: int) -> list[dict[str, Any]]:
    if count == 0:
        return []
    lines = storage.read_text(dirname, "result.json").splitlines()
    if len(lines) < count:
        raise RuntimeError(
            f"{storage.full_url(dirname, 'result.json')} has {len(lines)} results but the "
            f"committed state counts {count}: the experiment folder was changed by hand"
        )
    return [json.loads(line) for line in lines[:count]]


def restore_records(
    storage: Storage, commit: dict[str, Any], log: ExperimentLog
) -> list[TrialRecord]:
    """Trial records as of ``commit``, with storage cleaned of anything uncommitted.

    Derived logs are cut back to their committed sizes, then any committed
    lines they lack (object stores flush them only every so often) are
    appended from the commits; ``commit["derived"]`` is updated to match.
    """
    for path, size in commit["derived"].items():
        storage.truncate(size, path)
    _rebuild_tails(storage, commit, log)
    records = []
    for t in commit["trials"]:
        status = TrialStatus(t["status"])
        if status == TrialStatus.RUNNING:  # its segment's result was never committed
            status = TrialStatus.PENDING
        trial = Trial(
            trial_id=t["trial_id"],
            config=t["config"],
            status=status,
            last_train_time=t["last_train_time"],
            experiment_tag=t["experiment_tag"],
        )
        rec = TrialRecord(
            trial=trial,
            index=t["index"],
            dirname=t["dirname"],
            restore=t["restore"],
            restore_iteration=t["restore_iteration"],
            checkpoints=[CheckpointRecord(**c) for c in t["checkpoints"]],
            num_failures=t["num_failures"],
            error=t["error"],
            lineage=t["lineage"],
            generation=t["generation"],
            csv_header=t["csv_header"],
        )
        rec.results = _read_results(storage, rec.dirname, t["num_results"])
        trial.last_result = rec.results[-1] if rec.results else {}
        records.append(rec)
    _clean(storage, records)
    return records


def _count_lines(storage: Storage, *parts: str) -> int:
    try:
        return storage.read_text(*parts).count("\n")
    except FileNotFoundError:
        return 0


def _rebuild_tails(storage: Storage, commit: dict[str, Any], log: ExperimentLog) -> None:
    """Append committed results and policy lines that the derived logs do not hold yet."""
    trials = {t["trial_id"]: t for t in commit["trials"]}
    need = {}
    for tid, t in trials.items():
        missing = t["num_results"] - _count_lines(storage, t["dirname"], "result.json")
        if missing > 0:
            need[tid] = missing
    policy_missing = commit.get("policy_total", 0) - _count_lines(storage, "pbt_global.txt")
    if not need and policy_missing <= 0:
        return
    tails: dict[str, list[dict[str, Any]]] = {tid: [] for tid in need}
    policy: list[Any] = []
    for seq in reversed([n for n in log.commit_numbers() if n <= commit["seq"]]):
        older = log.read(seq)
        for tid, n in need.items():
            if len(tails[tid]) < n:
                tails[tid] = older["results"].get(tid, []) + tails[tid]
        if len(policy) < policy_missing:
            policy = older.get("policy", []) + policy
        if all(len(tails[t]) >= n for t, n in need.items()) and len(policy) >= policy_missing:
            break
    derived = commit["derived"]
    for tid, n in need.items():
        t, rows = trials[tid], tails[tid][-n:]
        result_path = (t["dirname"], "result.json")
        derived["/".join(result_path)] = storage.append_text(
            "".join(dumps(r) + "\n" for r in rows), *result_path
        )
        csv_path = (t["dirname"], "progress.csv")
        header = t["csv_header"]
        text = "".join(csv_row([r.get(k, "") for k in header]) for r in rows)
        if _count_lines(storage, *csv_path) == 0:
            text = csv_row(header) + text
        derived["/".join(csv_path)] = storage.append_text(text, *csv_path)
    if policy_missing > 0:
        lines = "".join(dumps(p) + "\n" for p in policy[-policy_missing:])
        derived["pbt_global.txt"] = storage.append_text(lines, "pbt_global.txt")


def _clean(storage: Storage, records: list[TrialRecord]) -> None:
    referenced = {r.restore for r in records if r.restore}
    for rec in records:
        kept = {c.name for c in rec.checkpoints}
        for name in storage.listdir(rec.dirname):
            orphan = name.startswith("checkpoint_") and name not in kept
            if (orphan and f"{rec.dirname}/{name}" not in referenced) or any(
                s in name for s in _SCRATCH
            ):
                logger.info("removing uncommitted %s/%s", rec.dirname, name)
                storage.remove(rec.dirname, name)
        if rec.trial.status != TrialStatus.ERROR:
            storage.remove(rec.dirname, "error.txt")
        policy = f"pbt_policy_{rec.trial_id}.txt"
        if rec.lineage:
            storage.write_text("".join(dumps(p) + "\n" for p in rec.lineage), policy)
        else:
            storage.remove(policy)
