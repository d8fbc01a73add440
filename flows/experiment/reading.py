"""An experiment in storage as of its latest commit, for readers (reads only).

The latest commit (:class:`ExperimentLog`) gives the trial table and the
scheduler's state, ``experiment.json`` the run's name, scheduler, seed, metric
and mode, and each trial's committed ``result.json`` lines its results.
Nothing is written and the lease is never taken, so a running experiment can
be read as it goes. :meth:`ResultGrid.from_path
<popflow.flows.experiment.results.ResultGrid.from_path>`, ``popflow status``/``show`` and
the plots (:mod:`popflow.flows.plots.reading`) read through here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from popflow.flows.experiment.commit_shape import MalformedExperiment, check_commit, problem_of_info
from popflow.flows.experiment.log_repair import committed_rows
from popflow.flows.experiment.trial_logs import result_lines
from popflow.flows.experiment.trial_table import TrialRecord, is_finished
from popflow.infra.storage.folder import Storage
from popflow.infra.store.commit_log import ExperimentLog
from popflow.infra.store.layout import EXPERIMENT_FILE, commit_path


class NoExperiment(FileNotFoundError):
    """No committed experiment at the path."""


class ExperimentState(StrEnum):
    """What is happening to an experiment, as its commit and its lease say."""

    FINISHED = "finished"  # every trial ended
    RUNNING = "running"  # a live driver holds the lease
    INTERRUPTED = "interrupted"  # unfinished and no live driver: `popflow resume` goes on


@dataclass(frozen=True)
class CommittedExperiment:
    """An experiment as its latest commit has it.

    ``records``: the trials as a resume would restore them (a trial committed
    RUNNING is PENDING: its segment's result was never committed); ``commit``
    the commit itself, whose trials keep their status as committed.
    """

    storage: Storage
    name: str
    scheduler: str
    scheduler_state: Mapping[str, Any]
    metric: str | None
    mode: str | None
    seed: int | None
    records: tuple[TrialRecord, ...]
    commit: Mapping[str, Any]
    round: int
    finished: bool


def read_committed(
    path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> CommittedExperiment:
    """Read the experiment at ``path`` (``<storage>/<name>``: a folder or fsspec URL) as of
    its latest commit; :class:`NoExperiment` if nothing is committed there."""
    storage = Storage(path, storage_options)
    log = ExperimentLog(storage)
    commit = log.latest()
    if commit is None:
        raise NoExperiment(f"no committed experiment at {storage.url}")
    check_commit(commit, storage.full_url(commit_path(commit["seq"])), storage.url)
    info = read_info(storage)
    state = commit.get("scheduler") or {}
    last = _last_results(storage, log, commit)
    return CommittedExperiment(
        storage=storage,
        name=info.get("name") or os.path.basename(storage.root.rstrip("/")),
        scheduler=info.get("scheduler", ""),
        scheduler_state=state,
        metric=info.get("metric") or state.get("metric"),
        mode=info.get("mode") or state.get("mode"),
        seed=info.get("seed"),
        records=tuple(TrialRecord.from_state(t, last[t["trial_id"]]) for t in commit["trials"]),
        commit=commit,
        round=int(commit.get("round", 0)),
        finished=is_finished(commit),
    )


def _last_results(
    storage: Storage, log: ExperimentLog, commit: Mapping[str, Any]
) -> dict[str, dict[str, Any]]:
    """Each trial's last committed result ({} if none), by trial id: its ``result.json``'s,
    or where that log lags the commits (an object store's is written only every so often,
    and an interrupted run's was never caught up), the commits' own."""
    lines = {
        t["trial_id"]: result_lines(storage, t["dirname"], int(t["num_results"]))
        for t in commit["trials"]
    }
    missing = committed_rows(log, dict(commit), {tid: len(got) for tid, got in lines.items()})
    return {
        tid: missing[tid][-1] if missing.get(tid) else json.loads(got[-1]) if got else {}
        for tid, got in lines.items()
    }


def read_info(storage: Storage) -> dict[str, Any]:
    """``experiment.json`` of the experiment at ``storage`` ({} if there is none);
    :class:`MalformedExperiment` if it is not what popflow writes."""
    try:
        text = storage.read_text(EXPERIMENT_FILE)
        info = json.loads(text)
    except FileNotFoundError:
        return {}
    except ValueError as e:  # UnicodeDecodeError too
        raise MalformedExperiment(storage.full_url(EXPERIMENT_FILE), f"not JSON ({e})") from None
    problem = problem_of_info(info)
    if problem:
        raise MalformedExperiment(storage.full_url(EXPERIMENT_FILE), problem)
    return info


def state_of(experiment: CommittedExperiment, driver: Mapping[str, Any] | None) -> ExperimentState:
    """Finished, running (``driver``, :func:`~popflow.infra.store.lease.live_holder`'s answer, holds the lease) or
    interrupted."""
    if experiment.finished:
        return ExperimentState.FINISHED
    return ExperimentState.RUNNING if driver is not None else ExperimentState.INTERRUPTED
