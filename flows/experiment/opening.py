"""Starting or resuming an experiment in storage, under its lease.

A fresh start samples the population from the seed, writes each trial's
``params.json``, the run's arguments (for ``popflow resume``) and
``.popflow/experiment.json``. A resume reads the last commit: the seed comes
from ``experiment.json``, the scheduler's state and the trial table from the
commit, and whatever was written after that commit did not happen (derived
logs are cut back to their committed sizes, checkpoints no commit knows are
deleted, lineage files are rewritten from the committed lineage).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from popflow.flows.experiment.commit_shape import check_commit
from popflow.flows.experiment.fallback import pinned
from popflow.flows.experiment.log_repair import rebuild_tails, rewrite_policy_files
from popflow.flows.experiment.new_trials import new_record
from popflow.flows.experiment.trial_logs import last_result, params_text
from popflow.flows.experiment.trial_table import TrialRecord, is_finished
from popflow.flows.spec.run_args import save_code_origin, save_run_args
from popflow.flows.spec.run_spec import RunSpec
from popflow.infra.storage.folder import Storage
from popflow.infra.storage.retry import RetryPolicy
from popflow.infra.storage.safe_paths import is_name
from popflow.infra.store.commit_log import CommitConflict, ExperimentLog
from popflow.infra.store.layout import (
    CHECKPOINT_PREFIX,
    ERROR_FILE,
    EXPERIMENT_FILE,
    GLOBAL_POLICY,
    LOGS,
    PARAMS,
    checkpoint_owner,
    commit_path,
    is_scratch,
    restarted_trial_dir,
)
from popflow.infra.store.lease import Lease, LeaseLost, newer_epoch
from popflow.schedulers import Trial, TrialScheduler, TrialStatus
from popflow.schedulers.variants import resolve_variants
from popflow.tasks.seeding import experiment_generators
from popflow.tasks.trainable import trainable_name

logger = logging.getLogger(__name__)


@dataclass
class Experiment:
    """An experiment opened for running: its storage, commit log and trial table.

    ``resumed_from``: the commit it continues (None: a fresh start).
    ``finished``: it had already finished; nothing is to run. ``lease``: held
    while the experiment is open for running.
    """

    storage: Storage
    log: ExperimentLog
    records: list[TrialRecord]
    seed: int
    resumed_from: dict[str, Any] | None
    finished: bool = False
    lease: Lease | None = None
    #: the experiment's name: ``spec.name``, or the next free one (:func:`_next_free_name`)
    name: str = ""


@contextmanager
def open_experiment(
    spec: RunSpec,
    resume: bool | str,
    make_lease: Callable[[Storage, float], Lease] = Lease,
) -> Iterator[Experiment]:
    """The experiment ``spec`` names, started or resumed, held under its lease while in use.

    ``resume``: False refuses an existing experiment, True requires one,
    "auto" resumes one if there is one. A finished experiment is returned
    as it is (no lease: nothing will be written). ``make_lease``: makes the lease from the
    experiment's storage and ``spec.lease_ttl`` (a simulation's is on its virtual clock,
    :class:`~popflow.flows.backends.simulated.VirtualLease`).
    """
    storage = spec.experiment_storage
    log = ExperimentLog(storage)
    latest = log.latest()  # DamagedLog if no commit can be used: nothing is changed
    if latest is not None and not resume:
        spec = _next_free_name(spec, "finished" if is_finished(latest) else "unfinished")
        storage = spec.experiment_storage
        log = ExperimentLog(storage)
        latest = None
    if latest is None and resume is True:
        raise ValueError(f"nothing to resume: no committed experiment at {storage.url}")
    if latest is not None:  # used below: refuse a forged or wrong-shaped one before the lease
        check_commit(latest, storage.full_url(commit_path(latest["seq"])), storage.url)
    requeue = spec.errored != "skip" and any(
        t["status"] == TrialStatus.ERROR.value for t in (latest or {}).get("trials", [])
    )
    if latest is not None and is_finished(latest) and not requeue:
        logger.debug("%s already finished; returning its results", spec.name)
        records = restore_records(storage, latest, log, spec.scheduler)
        yield Experiment(
            storage, log, records, _saved_seed(storage), latest, finished=True, name=spec.name
        )
        return
    with make_lease(storage, spec.lease_ttl) as lease:
        log.epoch = lease.epoch
        if not storage.is_local and storage.retry == RetryPolicy():
            # an object store's outage shorter than the lease is ridden out, by the driver
            # and by the workers its storage is sent to (Lease.outage: a longer one ends it)
            storage.retry = RetryPolicy.within(spec.lease_ttl)
            storage.answered_within = lease.answered_within
        storage.lease_lost = lease.lost  # a driver that lost it stops without waiting on storage
        if latest is not None:
            with _caller_streams_kept():
                yield _resume(spec, storage, log, lease)
        elif log.commit_numbers():  # another driver started it while this one took the lease
            raise ValueError(
                f"an experiment named {spec.name!r} was started at {storage.url} by another "
                "driver meanwhile; resume it or choose another `name`"
            )
        else:
            seed = spec.seed
            if seed is None:  # from numpy's global state in this (the user's) process, where
                # Ray's random search samples: a script that calls np.random.seed(...) repeats
                seed = int(np.random.randint(2**32, dtype=np.int64))
            with _caller_streams_kept():
                yield _start(spec, storage, log, lease, seed)


@contextmanager
def _caller_streams_kept() -> Iterator[None]:
    """The driver seeds ``random`` and numpy's global RNG as it goes (for the user's
    callables); the caller's streams are put back after the run, so what the script draws
    next (the next run's seed) does not depend on how many decisions this run took."""
    python, numpy = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)


def _next_free_name(spec: RunSpec, state: str) -> RunSpec:
    """A run that is not a resume, under the name of an existing experiment: it starts a
    new one as ``<name>_2`` (``_3``, ...), leaving the old one as it is."""
    for k in itertools.count(2):
        name = f"{spec.name}_{k}"
        if ExperimentLog(spec.storage.child(name)).latest() is None:
            logger.warning(
                "%s already holds an %s experiment; this run starts a new one, %s "
                "(resume=True, resume='auto' or Tuner.restore continue the old one)",
                spec.experiment_storage.url,
                state,
                name,
            )
            return dataclasses.replace(spec, name=name)
    raise AssertionError("unreachable")


def _saved_seed(storage: Storage) -> int:
    return int(json.loads(storage.read_text(EXPERIMENT_FILE))["seed"])


#: How often a takeover retries when the driver it replaces still commits (it stops
#: at its next fence check, so once or twice at most).
_TAKEOVER_ATTEMPTS = 8


def _take_over(
    log: ExperimentLog, why: str | None = None, now: Callable[[], float] = time.time
) -> tuple[dict[str, Any], bool]:
    """Fence out any driver that still writes: publish a copy of the newest commit
    under this driver's epoch (the old driver's next commit then conflicts, and it
    stops). Returns that commit and whether it was reached past a damaged one.
    ``why``: this driver goes back to its own last commit (:func:`reopen`)."""
    for _ in range(_TAKEOVER_ATTEMPTS):
        found = log.find_latest()
        assert found is not None  # the caller saw a commit, and commits are never deleted
        previous = found.commit
        newer = previous.get("epoch")
        if isinstance(newer, int) and newer > log.epoch:
            # a newer driver committed: this one's marker after it would be a stale write
            # (the newer driver may be done and write no commit this one would conflict with)
            if newer_epoch(log.storage, log.epoch) is not None:
                raise LeaseLost(
                    f"{log.storage.url}: commit {previous['seq']} was written by driver "
                    f"epoch {newer}, newer than this one ({log.epoch}): another driver took "
                    "it over"
                )
            # no lease above this driver's: no driver of that epoch ever held it (a commit
            # edited by hand); going on keeps one writer, the holder of the newest lease
            logger.warning(
                "%s: commit %d names driver epoch %d, but no lease above this driver's (%d) "
                "exists: it was not written by a driver of this experiment; going on",
                log.storage.url,
                previous["seq"],
                newer,
                log.epoch,
            )
        # a newer one than the caller checked
        check_commit(previous, log.storage.full_url(commit_path(previous["seq"])), log.storage.url)
        marker = {k: v for k, v in previous.items() if k not in ("seq", "epoch")}
        marker.update(
            time=now(),  # the lease's clock: a simulation's markers are the same every run
            results={},
            policy=[],
            deleted=[],
            cuts={},
            events=[
                f"[takeover] driver epoch {log.epoch} continues from commit {previous['seq']}"
                if why is None
                else f"[rerun] {why}: driver epoch {log.epoch} goes on from commit "
                f"{previous['seq']}"
            ],
        )
        try:
            # in full (the newest may be damaged); the logs are brought up to date after it
            seq = log.commit(marker, snapshot=True, logs_through=0)
        except CommitConflict as conflict:
            if conflict.epoch is not None and conflict.epoch > log.epoch:
                raise  # a newer driver: this one has lost already
            continue  # the old driver's last commit landed meanwhile: continue from it
        return {**marker, "seq": seq, "epoch": log.epoch}, found.damaged is not None
    raise LeaseLost(f"{log.storage.url}: another driver keeps committing; not taking over")


def reopen(spec: RunSpec, experiment: Experiment, why: str) -> Experiment:
    """``experiment`` as its last commit left it, for its driver to go on from there
    (``why``: what it lost since; see :class:`~popflow.flows.driver.pipelined_commit.RoundLost`);
    what was written after that commit goes, as on a resume."""
    assert experiment.lease is not None  # held since it was opened for running
    return _resume(spec, experiment.storage, experiment.log, experiment.lease, why)


def _resume(
    spec: RunSpec, storage: Storage, log: ExperimentLog, lease: Lease, why: str | None = None
) -> Experiment:
    latest, fell_back = _take_over(log, why, lease.clock)
    ended: list[str] = []
    if not spec.resume_unfinished and why is None:  # a rerun (reopen) goes on as it was
        latest, ended = _end_unfinished(spec, log, latest, lease.clock)
    seed = _saved_seed(storage)
    scheduler = spec.scheduler
    scheduler.set_rng(experiment_generators(seed).scheduler)
    scheduler.set_state(latest["scheduler"])
    records = restore_records(
        storage, latest, log, scheduler, remove_orphans=not fell_back, guard=lease.guard()
    )
    for rec in records:
        if rec.trial_id in ended:
            scheduler.on_trial_remove(rec.trial)
    if spec.errored != "skip":
        records = _requeue_errored(spec, storage, records)
    logger.debug("%s: resuming after round %d from %s", spec.name, latest["round"], storage.url)
    return Experiment(storage, log, records, seed, latest, lease=lease, name=spec.name)


def _end_unfinished(
    spec: RunSpec, log: ExperimentLog, latest: dict[str, Any], now: Callable[[], float]
) -> tuple[dict[str, Any], list[str]]:
    """Ray's ``resume_unfinished=False``: the trials ``latest`` has unfinished (pending,
    running, paused) end as they are, TERMINATED, even one never trained (Ray's);
    errored ones are left to ``spec.errored``. Committed at once (an experiment left
    with nothing to run commits no round): the commit it wrote and the trials it ended."""
    live = {s.value for s in (TrialStatus.PENDING, TrialStatus.RUNNING, TrialStatus.PAUSED)}
    ended = [t["trial_id"] for t in latest["trials"] if t["status"] in live]
    if not ended:
        return latest, []
    marker = {k: v for k, v in latest.items() if k not in ("seq", "epoch")}
    marker.update(
        trials=[
            {**t, "status": TrialStatus.TERMINATED.value} if t["trial_id"] in ended else t
            for t in latest["trials"]
        ],
        time=now(),
        results={},
        policy=[],
        deleted=[],
        cuts={},
        events=[f"[restore] resume_unfinished=False: {', '.join(ended)} end TERMINATED"],
    )
    seq = log.commit(marker, snapshot=True, logs_through=0)  # as the takeover's
    logger.info(
        "%s: unfinished trials %s end here (resume_unfinished=False)", spec.name, ", ".join(ended)
    )
    return {**marker, "seq": seq, "epoch": log.epoch}, ended


def _requeue_errored(
    spec: RunSpec, storage: Storage, records: list[TrialRecord]
) -> list[TrialRecord]:
    """Ray's ``resume_errored`` (``spec.errored == "resume"``: an errored trial goes on
    from its last checkpoint) or ``restart_errored`` ("restart": it is replaced by a
    new trial with its config, from scratch, in a new folder; the old folder stays)."""
    out = []
    for rec in records:
        if rec.trial.status != TrialStatus.ERROR:
            out.append(rec)
            continue
        if spec.errored == "resume":
            rec.trial.status, rec.error, rec.num_failures = TrialStatus.PENDING, None, 0
            new = rec
        else:
            restarts = 1 + sum(1 for r in records if r.trial_id.startswith(f"{rec.trial_id}_r"))
            trial_id = f"{rec.trial_id}_r{restarts}"
            old = rec.trial
            trial = Trial(
                trial_id=trial_id,
                config=old.config,
                experiment_tag=old.experiment_tag,
                trainable_name=old.trainable_name,
                custom_name=f"{old.custom_name}_r{restarts}" if old.custom_name else None,
                evaluated_params=dict(old.evaluated_params),
            )
            new = TrialRecord(
                trial=trial, index=rec.index, dirname=restarted_trial_dir(rec.dirname, restarts)
            )
        spec.scheduler.on_trial_add(new.trial)
        logger.info("%s: %s errored trial %s", spec.name, spec.errored, rec.trial_id)
        out.append(new)
    return out


def _start(
    spec: RunSpec, storage: Storage, log: ExperimentLog, lease: Lease, seed: int
) -> Experiment:
    records = sample_population(spec, seed)  # a bad trial_*_creator: raise before writing
    save_run_args(storage, spec.run_args(seed))
    save_code_origin(storage, spec.trainable)
    log.write_experiment(
        {
            "name": spec.name,
            "seed": seed,
            "trainable": trainable_name(spec.trainable),
            "scheduler": type(spec.scheduler).__name__,
            "metric": spec.metric,
            "mode": spec.mode,
            "num_trials": len(records),
            "created": lease.clock(),
        }
    )
    logger.debug(
        "%s: %d trials, %s, results in %s (seed %d)",
        spec.name,
        len(records),
        spec.scheduler.debug_string(),
        storage.url,
        seed,
    )
    return Experiment(storage, log, records, seed, None, lease=lease, name=spec.name)


def sample_population(spec: RunSpec, seed: int) -> list[TrialRecord]:
    """The trials of a fresh experiment, added to its scheduler, which gets the
    experiment's generator. With a ``search_alg`` there are none yet: the driver asks
    the searcher for each (:mod:`popflow.flows.driver.suggestions`)."""
    generators = experiment_generators(seed)
    scheduler = spec.scheduler
    scheduler.set_rng(generators.scheduler)
    # user callables in hyperparam_mutations / sample_from use the global RNGs. Without a
    # seed of the run's, Python's ``random`` goes on from the script's own state, as in
    # Ray: a ``random.seed(...)`` there repeats a sample_from that calls ``random`` (numpy's
    # is seeded from the experiment seed, itself drawn from numpy's global state)
    if spec.seed is not None:
        random.seed(seed)
    np.random.seed(seed % 2**32)
    if spec.search_alg is not None:
        return []
    records = [
        new_record(spec, variant.index, variant.config, variant.tag, variant.evaluated_params)
        for variant in resolve_variants(spec.param_space, spec.num_samples, generators.variants)
    ]
    dirnames = [r.dirname for r in records]
    if len(set(dirnames)) < len(dirnames):
        twice = sorted({d for d in dirnames if dirnames.count(d) > 1})
        raise ValueError(f"`trial_dirname_creator` gave two trials the same folder: {twice}")
    for rec in records:
        spec.scheduler.on_trial_add(rec.trial)
    return records


# -- reading an experiment back ---------------------------------------------------


#: endings of the files at an experiment's top (not trial folders: not listed at a resume)
ROOT_FILES = (".txt", ".json", ".csv", ".pkl", ".log")


def restore_records(
    storage: Storage,
    commit: dict[str, Any],
    log: ExperimentLog,
    scheduler: TrialScheduler | None = None,
    remove_orphans: bool = True,
    guard: Callable[[], None] = lambda: None,
) -> list[TrialRecord]:
    """Trial records as of ``commit``, with storage cleaned of anything uncommitted.

    Derived logs are adopted (:meth:`~popflow.infra.storage.folder.Storage.adopt_log`:
    from now on only this driver's appends land on them) and cut back to their committed
    sizes (a log the commit does not size was written after it: cut to nothing), then
    any committed lines they lack are appended from the commits; ``commit["derived"]`` is
    updated to match.
    Lineage files are rewritten unless ``scheduler`` does not log them.
    ``remove_orphans``: delete checkpoints ``commit`` does not know (False when a
    damaged newer commit may have referenced them). ``guard``: called before each
    write or deletion (the lease's, :meth:`~popflow.infra.store.lease.Lease.guard`: a driver
    taken over while it cleans up stops before it cuts a newer driver's logs).
    """
    derived = commit["derived"]
    names = {t["dirname"]: storage.listdir(t["dirname"]) for t in commit["trials"]}
    unsized = [f"{d}/{f}" for d, there in names.items() for f in LOGS if f in there]
    # a trial the commit does not know (a searcher's, suggested after it) may have logs:
    # adopted too, cut to nothing, so that the trial's first append here is this driver's
    for folder in storage.listdir():
        if folder not in names and is_name(folder) and not folder.endswith(ROOT_FILES):
            unsized += [f"{folder}/{f}" for f in LOGS if f in storage.listdir(folder)]
    for path in dict.fromkeys([*derived, GLOBAL_POLICY, *unsized]):
        # adopted: a stalled earlier driver's late appends land on no log read; the lease
        # is checked between looking at the log and replacing it
        storage.adopt_log(derived.get(path, 0), path, guard=guard)
    rebuild_tails(storage, commit, log, guard)
    records = [
        TrialRecord.from_state(t, last_result(storage, t["dirname"], t["num_results"], strict=True))
        for t in commit["trials"]
    ]
    remove_uncommitted(
        storage, records, orphans=remove_orphans, guard=guard, names=names, epoch=log.epoch
    )
    if scheduler is None or scheduler.logs_policy:
        rewrite_policy_files(storage, records, guard)
    return records


def _newer_owner(storage: Storage, path: str, owner: int, epoch: int) -> None:
    """The orphan checkpoint ``path`` carries the name of driver epoch ``owner``, newer
    than this driver's ``epoch``: no orphan of this one's. ``LeaseLost`` if a newer driver
    holds a lease (this one stalled past its lease check); else nobody of that epoch ever
    ran (a name made by hand): left alone, with a warning. Either way nothing is deleted."""
    if newer_epoch(storage, epoch) is not None:
        raise LeaseLost(
            f"{storage.full_url(path)} was published by driver epoch {owner}, newer than "
            f"this one ({epoch}): it deletes nothing more"
        )
    logger.warning(
        "%s carries the name of driver epoch %d, but no lease above this driver's (%d) "
        "exists: popflow did not publish it; left as it is",
        storage.full_url(path),
        owner,
        epoch,
    )


def remove_uncommitted(
    storage: Storage,
    records: list[TrialRecord],
    orphans: bool = True,
    guard: Callable[[], None] = lambda: None,
    names: dict[str, list[str]] | None = None,
    epoch: int | None = None,
) -> None:
    """Delete half-published folders, error files of trials that did not error and,
    with ``orphans``, checkpoints no record knows (nor restores from); write the
    ``params.json`` a started trial lacks (the driver stopped before writing it).
    ``guard``: called before each write or deletion; ``names``: each trial folder's
    listing, if the caller has it. ``epoch``: this driver's. A checkpoint's name says
    which driver epoch alone publishes it (:func:`~popflow.infra.store.layout.checkpoint_owner`):
    one of a newer driver's is no orphan of this one's (it stops, ``LeaseLost``, instead),
    so a stale driver deletes nothing a newer one wrote without reading anything; one of
    its own epoch or an older one's, uncommitted, no driver from this one's fence on will
    commit (the takeover's commit came first)."""
    referenced = pinned(records)
    removed = 0  # said in one line at the end: a resumed PBT run removes dozens
    for rec in records:
        kept = {c.name for c in rec.checkpoints}
        listed = (names or {}).get(rec.dirname)
        names_here = storage.listdir(rec.dirname) if listed is None else listed
        for name in names_here:
            orphan = orphans and name.startswith(CHECKPOINT_PREFIX) and name not in kept
            if (orphan and rec.checkpoint_path(name) not in referenced) or is_scratch(name):
                guard()
                owner = None if is_scratch(name) else checkpoint_owner(name)
                if epoch and owner is not None and owner > epoch:
                    _newer_owner(storage, rec.checkpoint_path(name), owner, epoch)
                    continue
                logger.debug("removing uncommitted %s/%s", rec.dirname, name)
                storage.remove(rec.dirname, name)
                removed += 1
        if rec.trial.status != TrialStatus.ERROR and ERROR_FILE in names_here:
            guard()
            storage.remove(rec.dirname, ERROR_FILE)
        if (rec.num_results or rec.restore) and PARAMS not in names_here:
            guard()
            storage.write_text(params_text(rec.params), rec.dirname, PARAMS)
    if removed:
        logger.info(
            "removed %d uncommitted checkpoint%s in %s (the paths at DEBUG)",
            removed,
            "" if removed == 1 else "s",
            storage.url,
        )
