"""An experiment in storage as a plot needs it, as of its latest commit (reads only).

:mod:`popflow.flows.experiment.reading` reads the latest commit (trial table,
scheduler state, the trials' committed ``result.json`` lines, which make a
:class:`~popflow.flows.experiment.results.ResultGrid`); PBT's exploits come from
``pbt_global.txt`` (Ray's line: target tag, source tag, target and source
``training_iteration``, the source's config, the new config). Nothing is
written, so a running experiment can be read as it goes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from popflow.flows.experiment.reading import NoExperiment, read_committed
from popflow.flows.experiment.results import ResultGrid, committed_results, flatten
from popflow.infra.storage.folder import Storage
from popflow.infra.store.layout import GLOBAL_POLICY, RUN_ARGS_FILE

__all__ = ["ExperimentSnapshot", "NoExperiment", "read_experiment"]


@dataclass(frozen=True)
class ExperimentSnapshot:
    """An experiment as its latest commit has it (what :func:`plot_data` needs).

    ``policy``: the exploits' ``pbt_global.txt`` lines; ``tags``: trial id of
    each trial's original experiment tag (the tags those lines name); ``choices``:
    the config keys PBT mutates within a list (``hyperparam_mutations``), and the list.
    """

    name: str
    scheduler: str
    scheduler_state: Mapping[str, Any]
    metric: str | None
    mode: str | None
    grid: ResultGrid
    policy: tuple[tuple[Any, ...], ...] = ()
    tags: Mapping[str, str] | None = None
    round: int = 0
    finished: bool = True
    choices: Mapping[str, tuple[Any, ...]] | None = None


def _policy_lines(storage: Storage, commit: Mapping[str, Any]) -> tuple[tuple[Any, ...], ...]:
    """The committed exploits: ``pbt_global.txt`` up to the commit's count; without that
    file (PBT's ``log_config=False``), the distinct entries of the trials' lineages."""
    try:
        text = storage.read_text(GLOBAL_POLICY)
    except FileNotFoundError:
        seen: dict[str, tuple[Any, ...]] = {}
        for t in commit["trials"]:
            for entry in t.get("lineage") or []:
                seen.setdefault(json.dumps(entry[:4]), tuple(entry))
        return tuple(sorted(seen.values(), key=lambda e: (e[2], e[3])))
    lines = [tuple(json.loads(line)) for line in text.splitlines() if line.strip()]
    total = commit.get("policy_total")
    return tuple(lines if total is None else lines[:total])


def _choices(storage: Storage) -> dict[str, tuple[Any, ...]]:
    """The keys the run's ``hyperparam_mutations`` give as a list, read from the JSON of
    its arguments (never unpickled: a plot runs no code); none if it has no such file."""
    try:
        record = json.loads(storage.read_text(RUN_ARGS_FILE))
        mutations = record["args"]["scheduler"]["kwargs"]["hyperparam_mutations"]
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return {}
    if not isinstance(mutations, dict):
        return {}
    return {k: tuple(v) for k, v in flatten(mutations).items() if isinstance(v, list)}


def read_experiment(
    path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> ExperimentSnapshot:
    """Read the experiment at ``path`` (a folder or fsspec URL) as of its latest commit.

    Reads only: a running experiment is not disturbed. :class:`NoExperiment` if
    nothing is committed there.
    """
    experiment = read_committed(path, storage_options)
    commit, state = experiment.commit, experiment.scheduler_state
    # the tags exploit lines name: a trial's original tag (Ray's start with its index)
    tags = {str(t["index"]): t["trial_id"] for t in commit["trials"]}
    tags.update({t["experiment_tag"]: t["trial_id"] for t in commit["trials"] if not t["lineage"]})
    for t in state.get("trials", []) if isinstance(state.get("trials"), list) else []:
        if isinstance(t, dict) and "orig_tag" in t:  # PBT's state: each trial's original tag
            tags[t["orig_tag"]] = t["trial_id"]
    return ExperimentSnapshot(
        name=experiment.name,
        scheduler=experiment.scheduler,
        scheduler_state=state,
        metric=experiment.metric,
        mode=experiment.mode,
        grid=committed_results(experiment),
        policy=_policy_lines(experiment.storage, commit),
        tags=tags,
        round=experiment.round,
        finished=experiment.finished,
        choices=_choices(experiment.storage),
    )
