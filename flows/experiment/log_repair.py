"""A resume's repairs of the derived logs: the lines the commits hold and the logs lack.

The commit a resume continues from records the sizes its logs had (``derived``), and
the resume cuts them back there (:func:`~popflow.flows.experiment.opening.restore_records`).
The logs may lack committed lines: an object store's are written only every so often,
and a trial whose logs a cut holds (:class:`~popflow.flows.experiment.trial_logs.TrialLogs`)
has its results since then in the commits only. :func:`rebuild_tails` appends them,
reading the commits back from the newest: each commit's results follow the trial's
results before it, or, where the commit records a cut (``cuts``: the trial's
results kept, and how many the commit before counted), follow the first of those.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from typing import Any

from popflow.flows.experiment.trial_logs import csv_row, lines_of
from popflow.flows.experiment.trial_table import TrialRecord
from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import DamagedCommit, ExperimentLog
from popflow.infra.store.layout import GLOBAL_POLICY, PROGRESS, RESULTS, policy_file


def _count_lines(storage: Storage, *parts: str) -> int:
    try:
        return storage.read_text(*parts).count("\n")
    except FileNotFoundError:
        return 0


def _count_records(storage: Storage, *parts: str) -> int:
    """Results in a ``progress.csv``: its CSV records after the header (a quoted value
    may hold a line break, so records are parsed, not lines counted)."""
    try:
        text = storage.read_text(*parts)
    except FileNotFoundError:
        return 0
    return max(0, sum(1 for _ in csv.reader(io.StringIO(text))) - 1)


class _Tail:
    """The results a trial's log lacks: its positions ``[have, total)`` of the result
    sequence, filled walking the commits back from the newest."""

    def __init__(self, have: int, total: int) -> None:
        self.have = have
        self.rows: dict[int, dict[str, Any]] = {}
        self.end = total  # results up to the commit being read
        self.cap = total  # positions at or past it were superseded by a later cut

    @property
    def done(self) -> bool:
        return self.end <= self.have or all(p in self.rows for p in self._wanted())

    def _wanted(self) -> range:
        return range(self.have, min(self.cap, self.end))

    def read(self, results: list[dict[str, Any]], cut: list[int] | None) -> None:
        """One commit's results for the trial (newest first), and its cut if any."""
        start = self.end - len(results)
        for i, row in enumerate(results):
            if self.have <= start + i < self.cap:
                self.rows.setdefault(start + i, row)
        if cut is not None:  # before this commit's results, the trial kept cut[0] of cut[1]
            self.cap = min(self.cap, cut[0])
            self.end = cut[1]
        else:
            self.end = start

    def lines(self) -> list[dict[str, Any]]:
        return [self.rows[p] for p in sorted(self.rows)]


def committed_rows(
    log: ExperimentLog, commit: dict[str, Any], have: dict[str, int]
) -> dict[str, list[dict[str, Any]]]:
    """The committed results (up to ``commit``) that each trial's log lacks, read from the
    commits; ``have``: how many results each trial's log holds, by trial id (reads only)."""
    totals = {t["trial_id"]: t["num_results"] for t in commit["trials"]}
    tails = {tid: _Tail(n, totals[tid]) for tid, n in have.items() if totals[tid] > n}
    _read_back(log, commit["seq"], tails, 0)
    return {tid: tail.lines() for tid, tail in tails.items()}


def _read_back(
    log: ExperimentLog, seq: int, tails: dict[str, _Tail], policy_missing: int
) -> list[Any]:
    """Fill ``tails`` from the commits up to ``seq``, newest first; the last
    ``policy_missing`` (or more) policy lines they hold."""
    policy: list[Any] = []
    if not tails and policy_missing <= 0:
        return policy
    for n in reversed([n for n in log.commit_numbers() if n <= seq]):
        try:
            older = log.read_record(n)
        except DamagedCommit:  # never continued from: its lines did not happen
            continue
        for tid, tail in tails.items():
            if not tail.done:
                tail.read(older["results"].get(tid, []), older.get("cuts", {}).get(tid))
        if len(policy) < policy_missing:
            policy = older.get("policy", []) + policy
        if all(t.done for t in tails.values()) and len(policy) >= policy_missing:
            break
    return policy


def rebuild_tails(
    storage: Storage,
    commit: dict[str, Any],
    log: ExperimentLog,
    guard: Callable[[], None] = lambda: None,
) -> None:
    """Append committed results and policy lines that the derived logs do not hold yet;
    ``commit["derived"]`` is updated. ``guard``: called before each write."""
    trials = {t["trial_id"]: t for t in commit["trials"]}
    tails, held = {}, {}
    for tid, t in trials.items():
        # each log counted on its own: one may lack lines the other holds (a driver
        # stopped between the two appends, or a stale driver's adoption cut one back)
        held[tid] = (
            _count_lines(storage, t["dirname"], RESULTS),
            _count_records(storage, t["dirname"], PROGRESS),
        )
        have = min(held[tid])
        if t["num_results"] > have:
            tails[tid] = _Tail(have, t["num_results"])
    policy_missing = commit.get("policy_total", 0) - _count_lines(storage, GLOBAL_POLICY)
    if not tails and policy_missing <= 0:
        return
    policy = _read_back(log, commit["seq"], tails, policy_missing)
    derived = commit["derived"]
    for tid, tail in tails.items():
        t, rows = trials[tid], tail.lines()
        in_json, in_csv = held[tid]
        guard()
        result_path = (t["dirname"], RESULTS)
        if rows[in_json - tail.have :]:
            json_rows = lines_of(rows[in_json - tail.have :])
            derived["/".join(result_path)] = storage.append_text(json_rows, *result_path)
        csv_path = (t["dirname"], PROGRESS)
        header = t["csv_header"]
        csv_rows = rows[in_csv - tail.have :]
        text = "".join(csv_row([r.get(k, "") for k in header]) for r in csv_rows)
        if _count_lines(storage, *csv_path) == 0:
            text = csv_row(header) + text
        if text:
            derived["/".join(csv_path)] = storage.append_text(text, *csv_path)
    if policy_missing > 0:
        guard()
        lines = lines_of(policy[-policy_missing:])
        derived[GLOBAL_POLICY] = storage.append_text(lines, GLOBAL_POLICY)


def rewrite_policy_files(
    storage: Storage, records: list[TrialRecord], guard: Callable[[], None] = lambda: None
) -> None:
    """Each trial's ``pbt_policy_<trial_id>.txt`` as its committed lineage says (``guard``:
    called before each write)."""
    for rec in records:
        guard()
        if rec.lineage:
            storage.write_text(lines_of(rec.lineage), policy_file(rec.trial_id))
        else:
            storage.remove(policy_file(rec.trial_id))
