"""Replay one trial's PBT config schedule from its ``pbt_policy_<trial_id>.txt``.

PBT finds a schedule of configs rather than one config. Each policy line is
``[target_tag, source_tag, target_iteration, source_iteration, old_config,
new_config]`` (:meth:`Exploit.policy_entry`). A trial's policy file starts with
a copy of its source's file, so the schedule is the chain of lines read from
the end while each line's target is the next line's source (Ray's
``_load_policy``). The replay starts from the first chained line's
``old_config`` and switches to a line's ``new_config`` once the trial reports
that line's ``source_iteration``: the iteration of the checkpoint the target
continued from, which is where the new config took over in the original run.

Example::

    >>> replay = PopulationBasedTrainingReplay("pbt_policy_t1.txt", lines=[
    ...     '["1", "0", 5, 4, {"lr": 0.1}, {"lr": 0.12}]'])
    >>> replay.complete_config({})
    {'lr': 0.1}
"""

from __future__ import annotations

import copy
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from popflow.schedulers.pbt_explore import perturbed_tag
from popflow.schedulers.trial import Trial
from popflow.schedulers.trial_scheduler import Action, Decision, Exploit, TrialScheduler

__all__ = ["PopulationBasedTrainingReplay", "load_policy"]

logger = logging.getLogger(__name__)

_CONTINUE = Decision(Action.CONTINUE)


def _parse_line(text: str, name: str, lineno: int) -> list[Any]:
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"PBT policy file {name}, line {lineno}: not JSON ({exc})") from None
    ok = (
        isinstance(row, list)
        and len(row) == 6
        and all(isinstance(x, int) and not isinstance(x, bool) for x in row[2:4])
        and all(isinstance(x, dict) for x in row[4:6])
    )
    if not ok:
        raise ValueError(
            f"PBT policy file {name}, line {lineno}: expected [target_tag, source_tag, "
            f"target_iteration, source_iteration, old_config, new_config], got {text.strip()!r}"
        )
    return row


def load_policy(
    lines: Sequence[str], name: str
) -> tuple[dict[str, Any], list[tuple[int, dict[str, Any]]]]:
    """Initial config and ``[(change_at_iteration, new_config), ...]`` from policy lines."""
    rows = [_parse_line(text, name, n) for n, text in enumerate(lines, 1) if text.strip()]
    if not rows:
        raise ValueError(f"PBT policy file {name} is empty: no exploit was logged for this trial")
    schedule: list[tuple[int, dict[str, Any]]] = []
    initial: dict[str, Any] = {}
    next_source_tag: str | None = None
    for target_tag, source_tag, _, source_iteration, old_config, new_config in reversed(rows):
        if next_source_tag is not None and target_tag != next_source_tag:
            break  # lineage ended: earlier lines belong to a history that was overwritten
        next_source_tag = source_tag
        initial = old_config
        schedule.append((source_iteration, new_config))
    return initial, schedule[::-1]


class PopulationBasedTrainingReplay(TrialScheduler):
    """Trains ONE trial with the config schedule of a finished PBT trial.

    ``policy_file`` is read with ``open()``; pass ``lines`` instead when the
    caller already read it (from remote storage), ``policy_file`` then only
    names it. Time is ``training_iteration``, as in Ray.
    """

    time_attr = "training_iteration"
    #: a config change the live trainable declines (``reset_config``) restores its checkpoint
    needs_checkpoints = True

    def __init__(
        self,
        policy_file: str | os.PathLike[str],
        *,
        lines: Sequence[str] | None = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        super().__init__(rng=rng)
        path = Path(policy_file).expanduser()
        self.policy_file = path.as_posix()
        if lines is None:
            if not path.is_file():
                raise FileNotFoundError(f"PBT policy file not found: {self.policy_file}")
            with open(path, encoding="utf-8") as fp:
                lines = fp.readlines()
        self._initial_config, self._policy = load_policy(lines, self.policy_file)
        self.experiment_tag = f"replay_{path.name}"
        self._trial_id: str | None = None
        self._position = 0  # index of the next change in self._policy
        self._config = copy.deepcopy(self._initial_config)
        self._current_step = 0
        self._num_perturbations = 0

    def complete_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """The schedule's initial config; the trial's own config is replaced (as in Ray)."""
        if config and config != self._initial_config:
            logger.warning(
                "PBT replay replaces the trial's config %r with the policy's initial config %r",
                config,
                self._initial_config,
            )
        return copy.deepcopy(self._initial_config)

    def on_trial_add(self, trial: Trial) -> None:
        if self._trial_id is not None and trial.trial_id != self._trial_id:
            raise ValueError(
                f"PBT replay trains one trial, but trial {trial.trial_id} was added after "
                f"{self._trial_id}; set num_samples=1"
            )
        self._trial_id = trial.trial_id

    def next_milestone(self, trial: Trial) -> int | None:
        """The iteration of the next config change (None once the schedule is done)."""
        if self._position < len(self._policy):
            return self._policy[self._position][0]
        return None

    def on_trial_result(self, trial: Trial, result: dict[str, Any]) -> Decision:
        if "training_iteration" not in result:
            return _CONTINUE
        step = result["training_iteration"]
        self._current_step = step
        old_config, start = self._config, self._position
        while self._position < len(self._policy) and step >= self._policy[self._position][0]:
            self._config = self._policy[self._position][1]
            self._position += 1
            self._num_perturbations += 1
        if self._position == start:
            return _CONTINUE
        logger.info("PBT replay at iteration %s: config changes to %r", step, self._config)
        new_config = copy.deepcopy(self._config)
        changed = [k for k in new_config if new_config.get(k) != old_config.get(k)]
        exploit = Exploit(
            trial_id=trial.trial_id,
            source_trial_id=trial.trial_id,  # continue from its own checkpoint
            target_iteration=step,
            source_iteration=step,
            source_config=copy.deepcopy(old_config),
            new_config=new_config,
            operations={k: "replay" for k in changed},
            target_tag=self.experiment_tag,
            source_tag=self.experiment_tag,
            new_tag=perturbed_tag(self.experiment_tag, new_config, new_config),
            scheduler=type(self).__name__,
        )
        return Decision(Action.CONTINUE, exploits=(exploit,))

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        state.update(
            trial_id=self._trial_id,
            position=self._position,
            config=copy.deepcopy(self._config),
            current_step=self._current_step,
            num_perturbations=self._num_perturbations,
        )
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        super().set_state(state)
        self._trial_id = state["trial_id"]
        self._position = state["position"]
        self._config = copy.deepcopy(state["config"])
        self._current_step = state["current_step"]
        self._num_perturbations = state["num_perturbations"]

    def debug_string(self) -> str:
        return (
            f"PopulationBasedTraining replay: Step {self._current_step}, "
            f"perturb {self._num_perturbations}"
        )
