"""The experiment's derived logs, as Ray writes them: each trial's ``result.json`` and
``progress.csv``, ``pbt_global.txt`` and ``pbt_policy_<trial_id>.txt``.

They are derived: every commit holds its round's results and exploit lines,
and the trial table holds each trial's lineage. Each write is fenced: it lands only on
the log this driver left (:mod:`popflow.infra.storage.log_writes`), so a driver that
wakes after a newer one took over adds nothing to the newer one's logs. Local files are
appended at once. Object stores have no append (every appended line rewrites the
object), so there the lines are written every ``flush_interval`` seconds,
and a resume appends whatever committed lines a log lacks
(:func:`popflow.flows.experiment.log_repair.rebuild_tails`).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from popflow.flows.experiment.trial_table import TrialRecord
from popflow.infra.helper_threads import helper_pool
from popflow.infra.jsonutil import dumps
from popflow.infra.storage.folder import LogChanged, Storage
from popflow.infra.store.json_delta import Changed
from popflow.infra.store.layout import GLOBAL_POLICY, PARAMS, PROGRESS, RESULTS, policy_file

logger = logging.getLogger(__name__)


def params_text(config: dict[str, Any]) -> str:
    """A trial's ``params.json``."""
    return dumps(config, indent=2, sort_keys=True)


def csv_row(values: list[Any]) -> str:
    """One CSV line (progress.csv)."""
    buf = io.StringIO()
    csv.writer(buf).writerow(values)
    return buf.getvalue()


def lines_of(entries: list[Any]) -> str:
    return "".join(dumps(e) + "\n" for e in entries)


@dataclass
class _Cut:
    """A trial's logs to cut back to ``keep`` results (``sizes`` bytes) once the commit
    after ``seq`` (the commit that records the cut; None: the next one) is durable; the
    trial's results since then wait in ``rows``."""

    rec: TrialRecord
    keep: int
    sizes: dict[tuple[str, ...], int]
    rows: list[dict[str, Any]] = field(default_factory=list)
    seq: int | None = None


class TrialLogs:
    """This round's new results and exploit lines, and their writing to the derived logs.

    ``derived``: committed size in bytes of each appended log (a resume cuts
    each back to it). ``policy_total``: ``pbt_global.txt`` lines so far.
    ``log_policy``: write the exploit logs at all (PBT's ``log_config``).

    A round's lines are written by a thread of their own after its commit, while the
    next round trains: with thousands of trials a round's appends took longer than
    its training. Each commit records the sizes the logs had reached by then
    (:meth:`settle`), so a resume cuts them back there and appends the committed
    lines they lack (:func:`~popflow.flows.experiment.log_repair.rebuild_tails`). A write that
    fails stops the run before the next commit, and no later line is written.

    A trial sent back to an earlier state has the results it logged after that state
    superseded (:meth:`rewind`). Cutting them out of its files is held back until the
    commit after the one that records the cut is durable: a resume may fall back to the
    commit before the newest, whose sizes count them, and a log must keep every byte
    such a commit counts. Meanwhile the trial's later results wait here, in order, and
    no commit holding one is pruned (the logs are said to hold only the lines of the
    commits before the cut).
    """

    def __init__(
        self,
        storage: Storage,
        flush_interval: float,
        log_policy: bool = True,
        derived: dict[str, int] | None = None,
        policy_total: int = 0,
        may_write: Callable[[], None] | None = None,
        lease_check: Callable[[], None] | None = None,
    ) -> None:
        """``may_write``: raises if this driver may no longer write (its lease was lost;
        the writer's thread calls it before each file on local disk, before each batch
        on object stores: :meth:`~popflow.infra.store.lease.Lease.guard`).
        ``lease_check``: looks in storage now (:meth:`~popflow.infra.store.lease.Lease.check`),
        called when a log is not as this driver left it
        (:class:`~popflow.infra.storage.log_writes.LogChanged`): a driver taken over stops
        with ``LeaseLost``, one that still holds the lease with the ``LogChanged``."""
        self.storage = storage
        self.flush_interval = 0.0 if storage.is_local else flush_interval
        self.log_policy = log_policy
        self.policy_total = policy_total
        self.new_results: dict[str, list[dict[str, Any]]] = {}
        self.policy_lines: list[list[Any]] = []
        self._touched: dict[str, TrialRecord] = {}  # trials with new results
        self._lineage_changed: dict[str, TrialRecord] = {}
        self._deferred: dict[tuple[str, ...], str] = {}
        self._deferred_policies: dict[str, str] = {}
        self._deferred_params: dict[str, str] = {}  # trial folder -> params.json
        self._deferred_through = 0  # the newest commit whose lines are deferred
        self._last_flush = time.monotonic()
        self._may_write = may_write
        self._lease_check = lease_check
        self._writer = helper_pool(1, "popflow-logs")  # inline in a simulation
        self._batches: list[Future[None]] = []  # submitted, not yet seen done
        self._lock = threading.Lock()  # guards the four below (the writer sets them)
        self._derived = dict(derived or {})
        self._derived_changed: set[str] | None = None  # None: all (nothing committed yet)
        self._written_through = 0  # the newest commit whose lines are all written
        self._failure: BaseException | None = None
        self._cuts: dict[str, _Cut] = {}  # trial -> its logs' cut, not yet made
        self._cut_writes: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        #: this round's cuts, for its commit: trial -> [results kept, results before]
        self._round_cuts: dict[str, list[int]] = {}

    @property
    def holding(self) -> bool:
        """A cut waits for one more commit (the run's end must make one)."""
        return bool(self._cuts)

    def add_result(self, rec: TrialRecord, result: dict[str, Any]) -> None:
        self.new_results.setdefault(rec.trial_id, []).append(result)
        self._touched[rec.trial_id] = rec

    def add_params(self, rec: TrialRecord) -> None:
        """The trial starts for the first time: its ``params.json`` (its config; Ray writes
        it when a trial starts), written before its first results."""
        self._deferred_params[rec.dirname] = params_text(rec.params)

    def add_exploit(self, entry: list[Any], target: TrialRecord) -> None:
        """An exploit's ``pbt_global.txt`` line; ``target``'s lineage changed."""
        if self.log_policy:
            self.policy_lines.append(entry)
            self._lineage_changed[target.trial_id] = target

    def rewind(self, rec: TrialRecord, keep: int) -> None:
        """Supersede ``rec``'s results after its first ``keep``: the trial goes on from a
        state that accounts for those only (a retry, a lost worker or a damaged checkpoint
        sent it back to an earlier checkpoint), so the results it logged after that state
        are dropped (``rec.num_results`` too) rather than logged twice: uncommitted ones
        at once, committed ones by a cut of its logs (see the class's doc).
        """
        if keep >= rec.num_results:
            return
        pending = self.new_results.get(rec.trial_id, [])
        committed = rec.num_results - len(pending)
        logger.info(
            "trial %s goes on from a state after %d of its %d results; the %d after it are "
            "superseded",
            rec.trial_id,
            keep,
            rec.num_results,
            rec.num_results - keep,
        )
        if keep >= committed:  # only uncommitted results go: they were never written
            del pending[keep - committed :]
            rec.num_results = keep
            return
        self.new_results.pop(rec.trial_id, None)
        first = self._round_cuts.setdefault(rec.trial_id, [keep, committed])
        first[0] = min(first[0], keep)
        cut = self._cuts.get(rec.trial_id)
        if cut is not None and keep >= cut.keep:  # within the results waiting for it
            del cut.rows[keep - cut.keep :]
            cut.seq = None
        else:
            self._cuts[rec.trial_id] = self._plan_cut(rec, keep)
        rec.num_results = keep

    def _plan_cut(self, rec: TrialRecord, keep: int) -> _Cut:
        """The sizes of ``rec``'s logs at ``keep`` results (their lines handed to the
        writer are written first; a cut not yet made left them as they were)."""
        self._flush()
        results, csv_path = (rec.dirname, RESULTS), (rec.dirname, PROGRESS)
        try:
            text = self.storage.read_text(*results)
        except FileNotFoundError:
            text = ""
        lines = text.splitlines(keepends=True)[:keep]
        try:
            table = self.storage.read_text(*csv_path)
        except FileNotFoundError:
            table = ""
        sizes = {
            results: len("".join(lines).encode("utf-8")),
            # the header, then one CSV record per result (a record may span lines)
            csv_path: csv_prefix_size(table, keep + (rec.csv_header is not None)),
        }
        with self._lock:  # the next commit says so: a resume cuts them there
            for parts, size in sizes.items():
                self._derived["/".join(parts)] = size
                if self._derived_changed is not None:
                    self._derived_changed.add("/".join(parts))
        rec.trial.last_result = json.loads(lines[-1]) if lines else {}
        return _Cut(rec, keep, sizes)

    def _flush(self) -> None:
        """Write every line handed over or waiting (not those a cut holds)."""
        self._hand_over()
        for batch in self._batches:
            batch.result()
        self._batches = []
        self._raise_failure()

    def end_round(self, seq: int) -> tuple[dict[str, list[dict[str, Any]]], list[list[Any]]]:
        """Queue the round's lines, those of commit ``seq``; its results and policy lines,
        for that commit (its cuts: :meth:`take_cuts`)."""
        for cut in self._cuts.values():
            cut.seq = seq if cut.seq is None else cut.seq
        for trial_id, results in self.new_results.items():
            rec = self._touched[trial_id]
            if trial_id in self._cuts:  # they wait for its cut
                self._cuts[trial_id].rows.extend(results)
                if rec.csv_header is None:
                    rec.csv_header = list(results[0])
                continue
            header = ""
            if rec.csv_header is None:
                rec.csv_header = list(results[0])
                header = csv_row(rec.csv_header)
            rows = "".join(csv_row([r.get(k, "") for k in rec.csv_header]) for r in results)
            self._defer((rec.dirname, RESULTS), lines_of(results))
            self._defer((rec.dirname, PROGRESS), header + rows)
        if self.policy_lines:
            self._defer((GLOBAL_POLICY,), lines_of(self.policy_lines))
        for trial_id in sorted(self._lineage_changed):
            lineage = self._lineage_changed[trial_id].lineage
            self._deferred_policies[policy_file(trial_id)] = lines_of(lineage)
        self._deferred_through = seq
        self.policy_total += len(self.policy_lines)
        out = (self.new_results, self.policy_lines)
        self.new_results, self.policy_lines = {}, []
        self._touched, self._lineage_changed = {}, {}
        return out

    def take_cuts(self) -> dict[str, list[int]]:
        """The round's cuts, for its commit: trial -> [results kept, results the commit
        before counted] (:func:`~popflow.flows.experiment.log_repair.rebuild_tails` reads them)."""
        cuts, self._round_cuts = self._round_cuts, {}
        return cuts

    def settle(self, final: bool) -> tuple[dict[str, int] | Changed, int]:
        """Before a commit: wait for the lines handed over (they had a round to be
        written), and with ``final`` write the rest too. Returns the logs' sizes (those
        that changed since the last call, after the first) and the newest commit whose
        lines they hold, for the commit; raises what a write raised.

        So when a commit is published no line is being written: a driver stopped
        there (say, SIGSTOP past its lease) has nothing half-written to go on with.
        """
        if final:
            self._hand_over()
        for batch in self._batches:
            batch.result()
        self._batches = []
        self._raise_failure()
        with self._lock:
            if self._derived_changed is None:
                sizes: dict[str, int] | Changed = dict(self._derived)
            else:
                sizes = Changed({k: self._derived[k] for k in self._derived_changed})
            self._derived_changed = set()
            return sizes, self._written_through

    def committed(self, final: bool = False) -> None:
        """After a commit: hand its lines to the writer, when due (object stores: every
        ``flush_interval``; ``final``: now), to be written while the next round trains;
        make the cuts that a commit after theirs made safe."""
        ready = [
            t for t, c in self._cuts.items() if c.seq is not None and c.seq < self._deferred_through
        ]
        for trial_id in ready:
            cut = self._cuts.pop(trial_id)
            for parts, size in cut.sizes.items():
                self._cut_writes.append((self._truncate, (size, *parts)))
            if cut.rows:
                rec = cut.rec
                assert rec.csv_header is not None
                rows = "".join(csv_row([r.get(k, "") for k in rec.csv_header]) for r in cut.rows)
                self._cut_writes.append((self._append, (lines_of(cut.rows), rec.dirname, RESULTS)))
                self._cut_writes.append((self._append, (rows, rec.dirname, PROGRESS)))
        if final or ready or time.monotonic() - self._last_flush >= self.flush_interval:
            self._hand_over()

    def _defer(self, parts: tuple[str, ...], text: str) -> None:
        self._deferred[parts] = self._deferred.get(parts, "") + text

    def _hand_over(self) -> None:
        writes: list[tuple[Callable[..., Any], tuple[Any, ...]]] = [
            (self.storage.write_text, (text, dirname, PARAMS))
            for dirname, text in self._deferred_params.items()
        ]
        writes += self._cut_writes  # a cut, then the results that waited for it
        self._cut_writes = []
        writes += [(self._append, (text, *parts)) for parts, text in self._deferred.items()]
        writes += [
            (self.storage.write_text, (text, name))
            for name, text in self._deferred_policies.items()
        ]
        self._deferred, self._deferred_policies, self._deferred_params = {}, {}, {}
        self._last_flush = time.monotonic()
        # a cut's trial has lines of its commit and later ones waiting: not yet written
        through = min([c.seq - 1 for c in self._cuts.values() if c.seq is not None], default=None)
        seq = self._deferred_through if through is None else min(through, self._deferred_through)
        if writes:
            self._batches.append(self._writer.submit(self._write, writes, seq))

    def close(self) -> None:
        """Let the writer finish what it was handed, then stop it (the lines not handed
        over are dropped: a resume appends them from the commits)."""
        self._writer.shutdown(wait=True)

    def _write(self, writes: list[tuple[Callable[..., Any], tuple[Any, ...]]], seq: int) -> None:
        """One batch, in the writer's thread, the lease checked first. On local disk it is
        checked before each file (``may_write`` looks in storage every so often), so a
        driver taken over stops between two files; on object stores, where each is a
        network round trip, the batch's writes go out in parallel after one check (a
        cut first: its appends follow it)."""
        if self._failure is not None:
            return  # a line missing in the middle of a log would be worse than none after it
        may_write = self._may_write or (lambda: None)
        try:
            cuts = [w for w in writes if w[0] == self._truncate]
            if self.storage.is_local or len(writes) < 2 or cuts:
                for fn, args in writes:
                    may_write()
                    fn(*args)
            else:
                may_write()
                with ThreadPoolExecutor(max_workers=min(16, len(writes))) as pool:
                    for future in [pool.submit(fn, *args) for fn, args in writes]:
                        future.result()
        except LogChanged as changed:  # fenced: nothing was written; who changed it?
            with self._lock:
                self._failure = self._lease_lost_or(changed)
            return
        except BaseException as exc:
            with self._lock:
                self._failure = exc
            return
        with self._lock:
            self._written_through = seq

    def _lease_lost_or(self, changed: LogChanged) -> BaseException:
        """``LeaseLost`` if a newer driver took over (it wrote the log), else ``changed``."""
        if self._lease_check is not None:
            try:
                self._lease_check()
            except Exception as lost:
                return lost
        logger.error(
            "%s; this driver still holds the lease, so something else wrote there: it stops, "
            "and `popflow resume` cuts the logs back to the commits and appends what they hold",
            changed,
        )
        return changed

    def _raise_failure(self) -> None:
        with self._lock:
            failure = self._failure
        if failure is not None:
            raise failure

    def _truncate(self, size: int, *parts: str) -> None:
        path = "/".join(parts)
        self.storage.truncate(size, *parts)
        with self._lock:
            self._derived[path] = size
            if self._derived_changed is not None:
                self._derived_changed.add(path)

    def _append(self, text: str, *parts: str) -> None:
        path = "/".join(parts)
        size = self.storage.append_text(text, *parts)
        with self._lock:
            self._derived[path] = size
            if self._derived_changed is not None:
                self._derived_changed.add(path)


def csv_prefix_size(text: str, records: int) -> int:
    """Bytes of ``text``'s first ``records`` CSV records (a quoted value may hold a
    line break, so records are counted by parsing, not by lines)."""
    consumed = 0

    def lines() -> Iterator[str]:
        nonlocal consumed
        for line in io.StringIO(text):
            consumed += len(line.encode("utf-8"))
            yield line

    reader = csv.reader(lines())
    for _ in range(records):
        if next(reader, None) is None:
            break
    return consumed


def result_lines(storage: Storage, dirname: str, count: int, strict: bool = False) -> list[str]:
    """The first ``count`` lines of a trial's ``result.json``: its committed results (a
    running driver may have written more). ``strict``: fewer is an error (the folder
    was changed by hand); else what is there (an object store's log may lag its commit)."""
    if count == 0:
        return []
    try:
        lines = storage.read_text(dirname, RESULTS).splitlines()
    except FileNotFoundError:
        if strict:
            raise
        return []
    if strict and len(lines) < count:
        raise RuntimeError(
            f"{storage.full_url(dirname, RESULTS)} has {len(lines)} results but the "
            f"committed state counts {count}: the experiment folder was changed by hand"
        )
    return [line for line in lines[:count] if line.strip()]


def last_result(storage: Storage, dirname: str, count: int, strict: bool = False) -> dict[str, Any]:
    """The last of a trial's ``count`` committed results ({} if none), as
    :func:`result_lines` reads them."""
    lines = result_lines(storage, dirname, count, strict=strict)
    return json.loads(lines[-1]) if lines else {}
