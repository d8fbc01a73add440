"""The experiment's derived logs, as Ray writes them: each trial's ``result.json`` and
``progress.csv``, ``pbt_global.txt`` and ``pbt_policy_<trial_id>.txt``.

They are derived: every commit holds its round's results and exploit lines,
and the trial table holds each trial's lineage. Local files are appended at
once. Object stores have no append (every appended line rewrites the
object), so there the lines are written every ``flush_interval`` seconds,
and a resume appends whatever committed lines a log lacks
(:func:`rebuild_tails`).
"""

from __future__ import annotations

import csv
import io
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from popflow.flows.trial_table import TrialRecord
from popflow.infra.experiment_log import DamagedCommit, ExperimentLog
from popflow.infra.jsonutil import dumps
from popflow.infra.storage import Storage

GLOBAL_POLICY = "pbt_global.txt"


def csv_row(values: list[Any]) -> str:
    """One CSV line (progress.csv)."""
    buf = io.StringIO()
    csv.writer(buf).writerow(values)
    return buf.getvalue()


def policy_file(trial_id: str) -> str:
    return f"pbt_policy_{trial_id}.txt"


def _lines(entries: list[Any]) -> str:
    return "".join(dumps(e) + "\n" for e in entries)


class TrialLogs:
    """This round's new results and exploit lines, and their writing to the derived logs.

    ``derived``: committed size in bytes of each appended log (a resume cuts
    each back to it). ``policy_total``: ``pbt_global.txt`` lines so far.
    ``log_policy``: write the exploit logs at all (PBT's ``log_config``).
    """

    def __init__(
        self,
        storage: Storage,
        flush_interval: float,
        log_policy: bool = True,
        derived: dict[str, int] | None = None,
        policy_total: int = 0,
    ) -> None:
        self.storage = storage
        self.flush_interval = 0.0 if storage.is_local else flush_interval
        self.log_policy = log_policy
        self.derived = dict(derived or {})
        self.policy_total = policy_total
        self.new_results: dict[str, list[dict[str, Any]]] = {}
        self.policy_lines: list[list[Any]] = []
        self._touched: dict[str, TrialRecord] = {}  # trials with new results
        self._lineage_changed: dict[str, TrialRecord] = {}
        self._deferred: dict[tuple[str, ...], str] = {}
        self._deferred_policies: dict[str, str] = {}
        self._last_flush = time.monotonic()

    def add_result(self, rec: TrialRecord, result: dict[str, Any]) -> None:
        self.new_results.setdefault(rec.trial_id, []).append(result)
        self._touched[rec.trial_id] = rec

    def add_exploit(self, entry: list[Any], target: TrialRecord) -> None:
        """An exploit's ``pbt_global.txt`` line; ``target``'s lineage changed."""
        if self.log_policy:
            self.policy_lines.append(entry)
            self._lineage_changed[target.trial_id] = target

    def end_round(self, final: bool) -> tuple[dict[str, list[dict[str, Any]]], list[list[Any]]]:
        """Queue the round's lines, and write them out when due (``final``: now).

        Returns the round's results and policy lines, for its commit.
        """
        for trial_id, results in self.new_results.items():
            rec = self._touched[trial_id]
            header = ""
            if rec.csv_header is None:
                rec.csv_header = list(results[0])
                header = csv_row(rec.csv_header)
            rows = "".join(csv_row([r.get(k, "") for k in rec.csv_header]) for r in results)
            self._defer((rec.dirname, "result.json"), _lines(results))
            self._defer((rec.dirname, "progress.csv"), header + rows)
        if self.policy_lines:
            self._defer((GLOBAL_POLICY,), _lines(self.policy_lines))
        for trial_id in sorted(self._lineage_changed):
            lineage = self._lineage_changed[trial_id].lineage
            self._deferred_policies[policy_file(trial_id)] = _lines(lineage)
        if final or time.monotonic() - self._last_flush >= self.flush_interval:
            self.flush()
        self.policy_total += len(self.policy_lines)
        out = (self.new_results, self.policy_lines)
        self.new_results, self.policy_lines = {}, []
        self._touched, self._lineage_changed = {}, {}
        return out

    @property
    def written(self) -> bool:
        """Every line so far is in the logs (none waits for a flush)."""
        return not self._deferred and not self._deferred_policies

    def _defer(self, parts: tuple[str, ...], text: str) -> None:
        self._deferred[parts] = self._deferred.get(parts, "") + text

    def flush(self) -> None:
        """Write every queued line. Writes to different files are independent; on
        object stores, where each is a network round trip, they go out in parallel."""
        writes: list[tuple[Any, tuple[Any, ...]]] = [
            (self._append, (text, *parts)) for parts, text in self._deferred.items()
        ]
        writes += [
            (self.storage.write_text, (text, name))
            for name, text in self._deferred_policies.items()
        ]
        self._deferred, self._deferred_policies = {}, {}
        self._last_flush = time.monotonic()
        if self.storage.is_local or len(writes) < 2:
            for fn, args in writes:
                fn(*args)
            return
        with ThreadPoolExecutor(max_workers=min(16, len(writes))) as pool:
            for future in [pool.submit(fn, *args) for fn, args in writes]:
                future.result()  # re-raise a storage error here, before the commit

    def _append(self, text: str, *parts: str) -> None:
        self.derived["/".join(parts)] = self.storage.append_text(text, *parts)


def _count_lines(storage: Storage, *parts: str) -> int:
    try:
        return storage.read_text(*parts).count("\n")
    except FileNotFoundError:
        return 0


def rebuild_tails(storage: Storage, commit: dict[str, Any], log: ExperimentLog) -> None:
    """Append committed results and policy lines that the derived logs do not hold yet
    (object stores flush them only every so often); ``commit["derived"]`` is updated."""
    trials = {t["trial_id"]: t for t in commit["trials"]}
    need = {}
    for tid, t in trials.items():
        missing = t["num_results"] - _count_lines(storage, t["dirname"], "result.json")
        if missing > 0:
            need[tid] = missing
    policy_missing = commit.get("policy_total", 0) - _count_lines(storage, GLOBAL_POLICY)
    if not need and policy_missing <= 0:
        return
    tails: dict[str, list[dict[str, Any]]] = {tid: [] for tid in need}
    policy: list[Any] = []
    for seq in reversed([n for n in log.commit_numbers() if n <= commit["seq"]]):
        try:
            older = log.read_record(seq)
        except DamagedCommit:  # never continued from: its lines did not happen
            continue
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
        derived["/".join(result_path)] = storage.append_text(_lines(rows), *result_path)
        csv_path = (t["dirname"], "progress.csv")
        header = t["csv_header"]
        text = "".join(csv_row([r.get(k, "") for k in header]) for r in rows)
        if _count_lines(storage, *csv_path) == 0:
            text = csv_row(header) + text
        derived["/".join(csv_path)] = storage.append_text(text, *csv_path)
    if policy_missing > 0:
        lines = _lines(policy[-policy_missing:])
        derived[GLOBAL_POLICY] = storage.append_text(lines, GLOBAL_POLICY)


def rewrite_policy_files(storage: Storage, records: list[TrialRecord]) -> None:
    """Each trial's ``pbt_policy_<trial_id>.txt`` as its committed lineage says."""
    for rec in records:
        if rec.lineage:
            storage.write_text(_lines(rec.lineage), policy_file(rec.trial_id))
        else:
            storage.remove(policy_file(rec.trial_id))
