"""A new trial's record: its id (from the experiment's name and the trial's index), its
config completed by the scheduler, its name and folder (Ray's ``trial_name_creator``,
``trial_dirname_creator``). Used for the trials sampled at the start and for those a
search algorithm suggests during the run."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from popflow.flows.experiment.trial_table import TrialRecord
from popflow.infra.store.layout import trial_dir
from popflow.schedulers import Trial
from popflow.tasks.trainable import trainable_name

if TYPE_CHECKING:
    from popflow.flows.spec.run_spec import RunSpec


def trial_id_of(experiment: str, index: int) -> str:
    """The id of the ``index``-th trial of the experiment named ``experiment``."""
    return f"{hashlib.sha1(experiment.encode()).hexdigest()[:5]}_{index:05d}"


def new_record(
    spec: RunSpec,
    index: int,
    config: dict[str, Any],
    tag: str,
    evaluated_params: dict[str, Any] | None = None,
) -> TrialRecord:
    """The record of a new trial, the ``index``-th of the experiment (not yet added to
    the scheduler): its id, the scheduler's completed ``config``, its name and folder.
    ``evaluated_params``: the sampled values, flattened (Ray's)."""
    name = trainable_name(spec.trainable)
    completed = spec.scheduler.complete_config(config)
    # Ray's PBT adds the hyperparam_mutations a config lacks to evaluated_params too
    added = {k: v for k, v in completed.items() if k not in config}
    trial = Trial(
        trial_id=trial_id_of(spec.name, index),
        config=completed,
        experiment_tag=tag,
        trainable_name=name,
        evaluated_params={**(evaluated_params or {}), **added},
    )
    trial.custom_name = _created("trial_name_creator", spec.trial_name_creator, trial)
    dirname = _created("trial_dirname_creator", spec.trial_dirname_creator, trial)
    return TrialRecord(trial=trial, index=index, dirname=dirname or trial_dir(name, trial.trial_id))


def _created(argument: str, creator: Any, trial: Trial) -> str | None:
    """What Ray's ``trial_name_creator``/``trial_dirname_creator`` returns for ``trial``."""
    if creator is None:
        return None
    made = creator(trial)
    if not isinstance(made, str) or not made.strip():
        raise ValueError(f"`{argument}` returned {made!r} for {trial.trial_id}; it must be a name")
    if argument == "trial_dirname_creator" and (
        "/" in made or "\\" in made or made in (".", "..") or made.startswith(".")
    ):
        raise ValueError(
            f"`{argument}` returned {made!r} for {trial.trial_id}; a trial folder is one "
            "name (no '/', not starting with '.')"
        )
    return made
