"""The round loop behind ``tune``: plan, train, reduce, commit.

- plan: the scheduler picks runnable trials (``choose_trial_to_run``) and
  says how far each may run (``next_milestone``);
- train: each segment runs on a Dask worker (:func:`popflow.tasks.segment.run_segment`);
- reduce: results go to the scheduler in a fixed order; its decisions
  (continue / pause / stop / exploit) are applied to the trial table;
- commit: results, logs and the full state are written to storage before the
  next round starts.

Synchronous schedulers (synch PBT, HyperBand) get a barrier per round and
see results in trial order, so a seeded run is reproducible whatever the
worker count. Asynchronous ones decide per result as segments finish
(``as_completed``) and dispatch the next segment at once; their commits are
grouped per ``commit_interval`` seconds.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from popflow.flows.config import CheckpointConfig
from popflow.flows.runner_pool import CallFailed, RunnerPool
from popflow.infra.experiment_log import ExperimentLog
from popflow.infra.jsonutil import dumps, jsonable
from popflow.infra.storage import Storage
from popflow.schedulers import Action, Decision, Exploit, Trial, TrialScheduler, TrialStatus
from popflow.tasks.live import discard_parked_soon
from popflow.tasks.progress import VOLATILE_FIELDS
from popflow.tasks.seeding import DRIVER, isolate_dask_sampling, seed_globals, segment_seed
from popflow.tasks.segment import CheckpointRecord, SegmentOutcome, SegmentSpec, StopCondition

logger = logging.getLogger(__name__)

TERMINAL_REASONS = ("done", "stop", "finished")

#: A Dask task costs the driver ~5-10 ms here (submit, scheduling, result
#: fetch), more than a short segment. Asynchronous dispatch packs segments
#: measured shorter than this into one task, up to this much work per task.
PACK_BELOW_SECONDS = 0.05
#: A trial whose runner calls return nothing this many times in a row errors.
MAX_CALL_FAILURES = 3


@dataclass
class TrialRecord:
    """The controller's book on one trial; ``state()`` is what a commit stores."""

    trial: Trial
    index: int
    dirname: str
    restore: str | None = None  # checkpoint folder (relative to the experiment) to resume from
    restore_iteration: int = 0
    checkpoints: list[CheckpointRecord] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    num_failures: int = 0
    error: str | None = None
    lineage: list[list[Any]] = field(default_factory=list)  # PBT policy entries
    generation: int = 0  # how often another trial's state was cloned into this one
    csv_header: list[str] | None = None
    #: (token, worker address) of the trainable parked on a worker; memory only,
    #: never committed: a lost live trainable just means a restore from storage
    live: tuple[str, str] | None = None

    @property
    def trial_id(self) -> str:
        return self.trial.trial_id

    @property
    def start_iteration(self) -> int:
        """The iteration the trial's next segment starts after."""
        if self.live is not None:
            return int(self.trial.last_result.get("training_iteration", self.restore_iteration))
        return self.restore_iteration

    def checkpoint_path(self, name: str) -> str:
        return f"{self.dirname}/{name}"

    def state(self) -> dict[str, Any]:
        t = self.trial
        return {
            "trial_id": t.trial_id,
            "index": self.index,
            "dirname": self.dirname,
            "config": t.config,
            "status": t.status.value,
            "experiment_tag": t.experiment_tag,
            "last_train_time": t.last_train_time,
            "num_results": len(self.results),
            "restore": self.restore,
            "restore_iteration": self.restore_iteration,
            "checkpoints": [
                {"name": c.name, "iteration": c.iteration, "result": c.result}
                for c in self.checkpoints
            ],
            "num_failures": self.num_failures,
            "error": self.error,
            "lineage": self.lineage,
            "generation": self.generation,
            "csv_header": self.csv_header,
        }


class Controller:
    def __init__(
        self,
        *,
        trainable: Any,
        records: list[TrialRecord],
        scheduler: TrialScheduler,
        storage: Storage,
        log: ExperimentLog,
        pool: RunnerPool,
        seed: int,
        stop: StopCondition = None,
        checkpoint_config: CheckpointConfig | None = None,
        checkpoint_at_end: bool = True,
        max_failures: int = 0,
        commit_interval: float = 1.0,
        log_flush_interval: float = 30.0,
    ) -> None:
        self.trainable = trainable
        self.records = records
        self.by_id = {r.trial_id: r for r in records}
        self.scheduler = scheduler
        self.storage = storage
        self.log = log
        self.pool = pool
        self.client = pool.client
        self.seed = seed
        self.stop = stop
        self.checkpoint_config = checkpoint_config or CheckpointConfig()
        self.checkpoint_at_end = checkpoint_at_end
        self.max_failures = max_failures
        self.commit_interval = commit_interval
        # Object stores have no append: every appended line rewrites the object.
        # There the derived logs are flushed every ``log_flush_interval`` seconds;
        # each commit holds its round's results and policy lines, so a resume
        # rebuilds an unflushed tail (flows.resume). Local files are appended at once.
        self.log_flush_interval = 0.0 if storage.is_local else log_flush_interval
        self._deferred: dict[tuple[str, ...], str] = {}
        self._deferred_policies: dict[str, str] = {}
        self._last_flush = time.monotonic()
        self.policy_total = 0  # pbt_global.txt lines committed so far
        self.in_flight: dict[int, list[TrialRecord]] = {}  # runner call -> its trials
        # retired checkpoints are deleted after their commit, off the round's path
        # (an object store takes a request or two per checkpoint)
        self._janitor = ThreadPoolExecutor(1, thread_name_prefix="popflow-retention")
        self._deleting: dict[str, Future[None]] = {}  # checkpoint path -> its deletion
        self._lost: dict[str, int] = {}  # trial -> calls in a row that returned nothing
        self._segment_seconds: float | None = None  # moving average of worker time per segment
        self._clock = max((r.trial.last_train_time for r in records), default=0.0)
        self._new_results: dict[str, list[dict[str, Any]]] = {}
        self._policy_lines: list[list[Any]] = []
        self._lineage_changed: set[str] = set()
        self._events: list[str] = []
        self._discards: dict[str, list[str]] = {}  # worker address -> parked tokens to drop
        self._derived: dict[str, int] = {}
        self.rounds = 0
        self.last_commit: dict[str, Any] = {"results": 0, "events": []}
        self.decisions = 0  # scheduler calls so far: seeds the driver's globals before each
        isolate_dask_sampling()

    def resume_from(self, commit: dict[str, Any]) -> None:
        """Continue the counters of a committed run (the records come from the same commit)."""
        self.rounds = commit["round"]
        self.decisions = commit["decisions"]
        self._derived = dict(commit["derived"])
        self.policy_total = commit.get("policy_total", 0)

    # -- plan ------------------------------------------------------------------
    @property
    def synchronous(self) -> bool:
        return self.scheduler.synchronous

    def _runnable(self) -> list[Trial]:
        return [
            r.trial
            for r in self.records
            if r.trial.status in (TrialStatus.PENDING, TrialStatus.PAUSED)
        ]

    def _plan(self, limit: int | None) -> list[TrialRecord]:
        """Mark the trials the scheduler picks as running, up to ``limit`` in flight."""
        planned: list[TrialRecord] = []
        while limit is None or self.running + len(planned) < limit:
            candidates = self._runnable()
            if not candidates:
                break
            chosen = self.scheduler.choose_trial_to_run(candidates)
            if chosen is None:
                break
            rec = self.by_id[chosen.trial_id]
            self._clock += 1
            rec.trial.status = TrialStatus.RUNNING
            rec.trial.last_train_time = self._clock
            planned.append(rec)
        return planned

    @property
    def running(self) -> int:
        return sum(len(recs) for recs in self.in_flight.values())

    def _spec(self, rec: TrialRecord) -> SegmentSpec:
        target = self.scheduler.next_milestone(rec.trial)
        freq = self.checkpoint_config.checkpoint_frequency
        return SegmentSpec(
            trainable=self.trainable,
            trial_id=rec.trial_id,
            trial_dir=rec.dirname,
            config=rec.trial.config,
            storage=self.storage,
            seed=segment_seed(self.seed, rec.index, rec.start_iteration, rec.generation),
            restore=rec.restore,
            time_attr=self.scheduler.time_attr,
            target=target,
            # without a scheduler milestone, end segments at checkpoints so progress is committed
            max_iterations=freq if (target is None and freq) else None,
            stop=self.stop,
            checkpoint_frequency=freq,
            checkpoint_at_end=self.checkpoint_at_end,
            # a name being deleted is not reused: the deletion would hit the new checkpoint
            taken=frozenset(c.name for c in rec.checkpoints)
            | {p.rsplit("/", 1)[1] for p in self._deleting if p.startswith(f"{rec.dirname}/")},
            live_token=rec.live[0] if rec.live else None,
        )

    def _pack_size(self, slots: int) -> int:
        """How many segments one asynchronous runner call carries.

        1 until segments are measured shorter than ``PACK_BELOW_SECONDS``; then
        enough to reach it, but never so many that a slot would lack its two
        queued calls (every unfinished trial in flight at most).
        """
        if self._segment_seconds is None or self._segment_seconds >= PACK_BELOW_SECONDS:
            return 1
        want = math.ceil(PACK_BELOW_SECONDS / max(self._segment_seconds, 1e-4))
        unfinished = sum(1 for r in self.records if r.trial.is_live)
        return max(1, min(want, math.ceil(unfinished / (2 * slots))))

    @staticmethod
    def _packs(recs: list[TrialRecord], size: int) -> list[list[TrialRecord]]:
        """Split ``recs`` into runner calls of up to ``size``: trials parked on one
        worker together (the call goes there), trials without a live trainable
        filling the gaps."""
        by_worker: dict[str, list[TrialRecord]] = {}
        cold: list[TrialRecord] = []
        for rec in recs:
            if rec.live:
                by_worker.setdefault(rec.live[1], []).append(rec)
            else:
                cold.append(rec)
        packs = [g[i : i + size] for g in by_worker.values() for i in range(0, len(g), size)]
        for pack in packs:
            while cold and len(pack) < size:
                pack.append(cold.pop(0))
        packs += [cold[i : i + size] for i in range(0, len(cold), size)]
        return packs

    def _submit(self, recs: list[TrialRecord]) -> None:
        """One runner call running ``recs``' segments one after the other.

        Trials with a live trainable go to the worker that parked it (if that
        worker is gone, another restores them from storage); one call only
        holds trials parked on the same worker.
        """
        pinned = next((r.live[1] for r in recs if r.live), None)
        call = self.pool.submit([self._spec(r) for r in recs], pinned)
        self.in_flight[call] = recs

    # -- train -----------------------------------------------------------------
    def _finished(self) -> list[SegmentOutcome]:
        """Block until some runner calls return; their outcomes."""
        return [o for call, value in self.pool.finished() for o in self._outcomes(call, value)]

    def _outcomes(
        self, call: int, value: list[SegmentOutcome] | CallFailed
    ) -> list[SegmentOutcome]:
        recs = self.in_flight.pop(call)
        if not isinstance(value, CallFailed):
            for outcome in value:
                self._lost.pop(outcome.trial_id, None)
                seconds = outcome.seconds
                avg = self._segment_seconds
                self._segment_seconds = seconds if avg is None else 0.8 * avg + 0.2 * seconds
            return value
        # no outcomes (the worker died, or the call could not run there): run
        # the segments again from storage; a trial whose calls keep failing errors
        outcomes = []
        for rec in recs:
            self._lost[rec.trial_id] = lost = self._lost.get(rec.trial_id, 0) + 1
            if lost >= MAX_CALL_FAILURES:
                error = f"{value.message} ({lost} times in a row)"
                outcomes.append(SegmentOutcome(trial_id=rec.trial_id, reason="error", error=error))
            else:
                logger.warning(
                    "trial %s: %s; running its segment again", rec.trial_id, value.message
                )
                rec.live = None
                rec.trial.status = TrialStatus.PENDING
        return outcomes

    def _reduce_all(self, outcomes: list[SegmentOutcome]) -> None:
        for outcome in sorted(outcomes, key=lambda o: self.by_id[o.trial_id].index):
            self._reduce(outcome)

    def run_round(self) -> bool:
        """Run one round; return True while work remains.

        Synchronous: every runnable trial runs, packed into one runner call
        per slot, then all results are reduced in trial order (a segment that
        must run again, its worker lost, runs again within the round).
        Asynchronous: up to ``2 * slots`` calls queued so no runner idles
        between a result and the next dispatch, each call one segment or, for
        short segments, a few; results are reduced as they arrive, for up to
        ``commit_interval`` seconds.
        """
        self.rounds += 1
        self.pool.refresh_soon()
        slots = self.pool.slots
        if self.synchronous:
            outcomes: list[SegmentOutcome] = []
            while True:
                planned = self._plan(limit=None)
                size = math.ceil(len(planned) / slots) if planned else 1
                for pack in self._packs(planned, size):
                    self._submit(pack)
                if not self.in_flight:
                    break
                outcomes.extend(self._finished())
            if not outcomes:
                return False
            self._reduce_all(outcomes)
        else:
            deadline = time.monotonic() + self.commit_interval
            while True:
                slots = self.pool.slots
                size = self._pack_size(slots)
                for pack in self._packs(self._plan(limit=2 * slots * size), size):
                    self._submit(pack)
                if not self.in_flight:
                    break
                self._reduce_all(self._finished())
                if time.monotonic() >= deadline:
                    break
        self._flush_discards()
        more = bool(self.in_flight) or bool(self._runnable())
        self.commit(final=not more)
        return more

    # -- reduce ----------------------------------------------------------------
    def _record(self, rec: TrialRecord, result: dict[str, Any]) -> None:
        result["config"] = rec.trial.config  # as Ray: the config this result was trained with
        rec.results.append(result)
        rec.trial.last_result = result
        self._new_results.setdefault(rec.trial_id, []).append(result)

    def _reduce(self, outcome: SegmentOutcome) -> None:
        rec = self.by_id[outcome.trial_id]
        rec.live = (
            (outcome.live_token, outcome.worker) if outcome.live_token and outcome.worker else None
        )
        if outcome.reason == "error":
            self._on_error(rec, outcome)
            return
        rec.checkpoints.extend(outcome.checkpoints)
        if outcome.checkpoints:
            last = outcome.checkpoints[-1]
            rec.restore, rec.restore_iteration = rec.checkpoint_path(last.name), last.iteration
        terminal = outcome.reason in TERMINAL_REASONS
        action = Action.CONTINUE
        for i, result in enumerate(outcome.results):
            self._record(rec, result)
            if terminal and i == len(outcome.results) - 1:
                break  # Ray: a result meeting a stop condition goes to on_trial_complete only
            self._seed_user_code()
            decision = Decision.of(self.scheduler.on_trial_result(rec.trial, result))
            action = decision.action
            self._apply_effects(rec, decision)
            if action == Action.STOP:
                dropped = len(outcome.results) - i - 1
                if dropped:
                    logger.debug(
                        "trial %s stopped; dropping %d later results", rec.trial_id, dropped
                    )
                break
        if terminal or action == Action.STOP:
            rec.trial.status = TrialStatus.TERMINATED
            self.scheduler.on_trial_complete(rec.trial, rec.trial.last_result)
            self._release_paused()
        elif action == Action.PAUSE:
            rec.trial.status = TrialStatus.PAUSED
        else:
            rec.trial.status = TrialStatus.PENDING
        held = rec.trial.status == TrialStatus.PAUSED and self.scheduler.pause_is_barrier
        if rec.trial.status != TrialStatus.PENDING and not held:
            self._discard_live(rec)  # paused for long or ended: free the worker's memory

    def _apply_effects(self, rec: TrialRecord | None, decision: Decision) -> None:
        """Apply exploits, then actions on other trials (``rec``: the reporting trial, if any)."""
        for exploit in decision.exploits:
            self._exploit(exploit, reporting=rec)
        removed = False
        for trial_id, action in decision.others.items():
            other = self.by_id[trial_id].trial
            if other.status == TrialStatus.RUNNING and (rec is None or trial_id != rec.trial_id):
                logger.warning("ignoring %s for running trial %s", action, trial_id)
            elif action == Action.CONTINUE and other.status == TrialStatus.PAUSED:
                other.status = TrialStatus.PENDING
            elif action == Action.PAUSE and other.status == TrialStatus.PENDING:
                other.status = TrialStatus.PAUSED
            elif action == Action.STOP and other.is_live:
                other.status = TrialStatus.TERMINATED
                self._discard_live(self.by_id[trial_id])
                self.scheduler.on_trial_remove(other)
                removed = True
        if removed:
            self._release_paused()

    def _seed_user_code(self) -> None:
        """Reseed the driver's global RNGs before a scheduler call.

        User callables such as ``lambda: random.uniform(...)`` in
        ``hyperparam_mutations`` draw from them; Prefect and Dask threads in this
        process may draw too, so a fixed stream per decision keeps runs repeatable.
        """
        self.decisions += 1
        seed_globals(segment_seed(self.seed, DRIVER, self.decisions))

    def _discard_live(self, rec: TrialRecord) -> None:
        if rec.live is not None:
            token, worker = rec.live
            self._discards.setdefault(worker, []).append(token)
            rec.live = None

    def _flush_discards(self) -> None:
        for worker, tokens in self._discards.items():
            self.client.run(discard_parked_soon, tokens, workers=[worker], wait=False)
        self._discards = {}

    def _release_paused(self) -> None:
        self._seed_user_code()
        decision = self.scheduler.release_paused()
        if decision is not None:
            self._apply_effects(None, decision)

    def _exploit(self, exploit: Exploit, reporting: TrialRecord | None) -> None:
        target, source = self.by_id[exploit.trial_id], self.by_id[exploit.source_trial_id]
        if target.trial.status == TrialStatus.RUNNING and target is not reporting:
            logger.warning("not exploiting into running trial %s", target.trial_id)
            return
        if source.restore is None:
            logger.warning(
                "%s has no checkpoint yet; %s keeps its own state", source.trial_id, target.trial_id
            )
            return
        if source is not target:
            target.restore, target.restore_iteration = source.restore, source.restore_iteration
            target.generation += 1
            self._discard_live(target)  # its state is replaced by the clone
        target.trial.config = exploit.new_config
        target.trial.experiment_tag = exploit.new_tag
        entry = jsonable(exploit.policy_entry())
        target.lineage = (
            [*source.lineage, entry] if source is not target else [*target.lineage, entry]
        )
        self._policy_lines.append(entry)
        self._lineage_changed.add(target.trial_id)
        self._events.append(exploit.describe())
        logger.info(exploit.describe())

    def _on_error(self, rec: TrialRecord, outcome: SegmentOutcome) -> None:
        for ckpt in outcome.checkpoints:  # never committed: nobody can refer to them
            self.storage.remove(rec.checkpoint_path(ckpt.name))
        if outcome.bad_checkpoint and self._drop_bad_checkpoint(
            outcome.bad_checkpoint, outcome.error
        ):
            rec.trial.status = TrialStatus.PENDING  # storage's fault, not the trial's: retry
            return
        rec.num_failures += 1
        if self.max_failures < 0 or rec.num_failures <= self.max_failures:
            logger.warning(
                "trial %s failed (%d/%s); retrying from %s",
                rec.trial_id,
                rec.num_failures,
                "inf" if self.max_failures < 0 else self.max_failures,
                rec.restore or "the start",
            )
            rec.trial.status = TrialStatus.PENDING
            return
        for result in outcome.results:
            self._record(rec, result)
        rec.error = outcome.error
        rec.trial.status = TrialStatus.ERROR
        self.scheduler.on_trial_error(rec.trial)
        self._release_paused()
        self.storage.write_text(outcome.error or "", rec.dirname, "error.txt")
        self._events.append(f"[error] {rec.trial_id}")
        logger.error("trial %s errored:\n%s", rec.trial_id, outcome.error)

    def _drop_bad_checkpoint(self, path: str, error: str | None) -> bool:
        """Stop using a checkpoint that failed its check; fall back to the previous good one.

        Every trial that would restore from it moves to the checkpoint its owner
        took before it (for a clone: an older state of the same source). False
        when the owner has no earlier checkpoint: the trial cannot go on.
        """
        owner = next((r for r in self.records if path.startswith(f"{r.dirname}/")), None)
        if owner is None:
            return False
        bad = next((c for c in owner.checkpoints if owner.checkpoint_path(c.name) == path), None)
        earlier = [
            c
            for c in owner.checkpoints
            if c is not bad and (bad is None or c.iteration < bad.iteration)
        ]
        if bad is not None:
            owner.checkpoints.remove(bad)
        last_line = (error or "").strip().splitlines()[-1:] or ["?"]
        if not earlier:
            logger.error(
                "checkpoint %s is corrupt and no earlier one exists: %s", path, last_line[0]
            )
            return False
        fallback = max(earlier, key=lambda c: c.iteration)
        for rec in self.records:
            if rec.restore == path:
                rec.restore = owner.checkpoint_path(fallback.name)
                rec.restore_iteration = fallback.iteration
        self._events.append(f"[corrupt checkpoint] {path}; using {fallback.name}")
        logger.error(
            "checkpoint %s failed its check (%s); falling back to %s",
            path,
            last_line[0],
            fallback.name,
        )
        return True

    # -- commit ----------------------------------------------------------------
    def _write_trial_logs(self, final: bool) -> None:
        """Queue this round's lines for the derived logs, and write them out when due.

        Writes to different files are independent; on object stores, where each
        is a network round trip, they go out in parallel.
        """
        for trial_id, results in self._new_results.items():
            rec = self.by_id[trial_id]
            header = ""
            if rec.csv_header is None:
                rec.csv_header = list(results[0])
                header = csv_row(rec.csv_header)
            rows = "".join(csv_row([r.get(k, "") for k in rec.csv_header]) for r in results)
            self._defer((rec.dirname, "result.json"), "".join(dumps(r) + "\n" for r in results))
            self._defer((rec.dirname, "progress.csv"), header + rows)
        if self._policy_lines:
            self._defer(("pbt_global.txt",), "".join(dumps(p) + "\n" for p in self._policy_lines))
        for trial_id in sorted(self._lineage_changed):
            lineage = "".join(dumps(p) + "\n" for p in self.by_id[trial_id].lineage)
            self._deferred_policies[f"pbt_policy_{trial_id}.txt"] = lineage
        if final or time.monotonic() - self._last_flush >= self.log_flush_interval:
            self._flush_logs()

    def _defer(self, parts: tuple[str, ...], text: str) -> None:
        self._deferred[parts] = self._deferred.get(parts, "") + text

    def _flush_logs(self) -> None:
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
        self._derived["/".join(parts)] = self.storage.append_text(text, *parts)

    def _retention(self) -> list[str]:
        """Checkpoints to delete after this commit (never one any trial will restore from)."""
        cfg = self.checkpoint_config
        if cfg.num_to_keep is None:
            return []
        referenced = {r.restore for r in self.records if r.restore}
        attr, sign = (
            cfg.checkpoint_score_attribute,
            (1.0 if cfg.checkpoint_score_order == "max" else -1.0),
        )
        doomed: list[str] = []
        for rec in self.records:
            if len(rec.checkpoints) <= cfg.num_to_keep:
                continue
            order = list(range(len(rec.checkpoints)))
            if attr is not None:  # best first; ties and missing scores favour the newer
                order.sort(
                    key=lambda i: (_score(rec.checkpoints[i].result, attr, sign), i), reverse=True
                )
            else:
                order.reverse()
            keep = set(order[: cfg.num_to_keep]) | {len(rec.checkpoints) - 1}
            kept = []
            for i, ckpt in enumerate(rec.checkpoints):
                if i in keep or rec.checkpoint_path(ckpt.name) in referenced:
                    kept.append(ckpt)
                else:
                    doomed.append(rec.checkpoint_path(ckpt.name))
            rec.checkpoints = kept
        return doomed

    def commit(self, final: bool = False) -> None:
        """Write this round's logs, then publish the commit, then delete retired checkpoints."""
        self._write_trial_logs(final)
        self.policy_total += len(self._policy_lines)
        doomed = self._retention()
        self.log.commit(
            {
                "round": self.rounds,
                "time": time.time(),
                "trials": [r.state() for r in self.records],
                "scheduler": self.scheduler.get_state(),
                "decisions": self.decisions,
                "derived": self._derived,
                "events": self._events,
                "deleted": doomed,
                "results": self._new_results,
                "policy": self._policy_lines,
                "policy_total": self.policy_total,
            }
        )
        self._retire(doomed, wait=final)
        self.last_commit = {
            "results": sum(map(len, self._new_results.values())),
            "events": self._events,
        }
        self._new_results, self._policy_lines, self._events = {}, [], []
        self._lineage_changed = set()

    def _retire(self, paths: list[str], wait: bool) -> None:
        """Delete committed-away checkpoints in the background (``wait``: and finish all)."""
        for path in paths:
            self._deleting[path] = self._janitor.submit(self._delete_retired, path)
        for path, deletion in list(self._deleting.items()):
            if wait or deletion.done():
                deletion.result()
                del self._deleting[path]

    def _delete_retired(self, path: str) -> None:
        try:
            self.storage.remove(path)
        except Exception as exc:  # garbage, not data: the run goes on, a resume removes it
            logger.warning("could not delete retired checkpoint %s: %s", path, exc)

    def round_summary(self) -> str:
        """One line on the last committed round, for the Prefect UI."""
        counts: dict[str, int] = {}
        for rec in self.records:
            counts[rec.trial.status.value] = counts.get(rec.trial.status.value, 0) + 1
        states = ", ".join(f"{n} {status.lower()}" for status, n in sorted(counts.items()))
        return (
            f"round {self.rounds} committed: {self.last_commit['results']} results; "
            f"trials {states}; {self.scheduler.debug_string()}"
        )

    # -- end -------------------------------------------------------------------
    def cancel(self) -> None:
        """Stop what is in flight and release every parked trainable."""
        self.pool.cancel()
        self.in_flight.clear()
        self._retire([], wait=True)
        self._janitor.shutdown()
        for rec in self.records:
            self._discard_live(rec)
        self._flush_discards()


def _score(result: dict[str, Any], attr: str, sign: float) -> float:
    value = result.get(attr)
    try:
        score = sign * float(value)
    except (TypeError, ValueError):
        return float("-inf")
    return float("-inf") if np.isnan(score) else score


def csv_row(values: list[Any]) -> str:
    """One CSV line (progress.csv)."""
    buf = io.StringIO()
    csv.writer(buf).writerow(values)
    return buf.getvalue()


def comparable(result: dict[str, Any]) -> dict[str, Any]:
    """A result without the fields that differ between identical seeded runs."""
    return {k: v for k, v in result.items() if k not in VOLATILE_FIELDS}
