"""The scheduler interface, its decisions, and the default FIFO scheduler.

A scheduler is a deterministic state machine: same calls, same injected
``numpy.random.Generator``, same decisions. It never touches the executor or
storage; what should happen comes back as data (:class:`Decision`), in the
spirit of Syne Tune's scheduler API rather than Ray's controller callbacks.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from popflow.schedulers.trial import Trial, TrialStatus
from popflow.schedulers.validation import check_mode


class Action(StrEnum):
    CONTINUE = "CONTINUE"
    PAUSE = "PAUSE"
    STOP = "STOP"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Exploit:
    """Restart ``trial_id`` from ``source_trial_id``'s latest checkpoint with ``new_config``.

    ``operations`` is the explore log, one entry per mutated key ("* 1.2",
    "shift left", "resample", ...), the readable record of what explore did.
    """

    trial_id: str
    source_trial_id: str
    target_iteration: int
    source_iteration: int
    source_config: dict[str, Any]
    new_config: dict[str, Any]
    operations: dict[str, str]
    target_tag: str
    source_tag: str
    new_tag: str
    #: the deciding scheduler's class name, and the two trials' latest scores (Ray's log)
    scheduler: str = ""
    source_score: float | None = None
    target_score: float | None = None

    def policy_entry(self) -> list[Any]:
        """Ray's pbt_global.txt / pbt_policy_*.txt line, as a list to json.dumps."""
        return [
            self.target_tag,
            self.source_tag,
            self.target_iteration,
            self.source_iteration,
            self.source_config,
            self.new_config,
        ]

    def brief(self) -> str:
        """One line for the commit's event list."""
        ops = ", ".join(f"{k}: {v}" for k, v in self.operations.items()) or "no change"
        return (
            f"[exploit] {self.trial_id} (iter {self.target_iteration}) <- "
            f"{self.source_trial_id} (iter {self.source_iteration}); explore: {ops}"
        )

    def describe(self) -> str:
        """The decision in Ray Tune's words: the exploit line, then the explore block with
        one ``key : old --- (operation) --> new`` line per mutated hyperparameter.

        >>> e = Exploit("t1", "t0", 5, 5, {"lr": 0.002}, {"lr": 0.0024}, {"lr": "* 1.2"},
        ...             "1_lr=0.001", "0_lr=0.002", "1_lr=0.0024", "PopulationBasedTraining",
        ...             0.9, 0.5)
        >>> print(e.describe())
        [PopulationBasedTraining] [Exploit] Cloning trial t0 (score = 0.900000) into trial t1 (score = 0.500000)
        [PopulationBasedTraining] [Explore] Perturbed the hyperparameter config of trial t1:
        lr : 0.002 --- (* 1.2) --> 0.0024
        """
        name = self.scheduler or "PopulationBasedTraining"
        if self.source_trial_id == self.trial_id:  # a replayed schedule: no clone
            return (
                f"[{name}] Population Based Training replay is now at step "
                f"{self.target_iteration}. Configuration of trial {self.trial_id} will be "
                f"changed to {self.new_config}."
            )
        changes = [
            f"{path} : {_at(self.source_config, path)!r} --- ({op}) --> "
            f"{_at(self.new_config, path)!r}"
            for path, op in self.operations.items()
        ]
        return "\n".join(
            [
                f"[{name}] [Exploit] Cloning trial {self.source_trial_id} "
                f"(score = {_score(self.source_score)}) into trial {self.trial_id} "
                f"(score = {_score(self.target_score)})",
                f"[{name}] [Explore] Perturbed the hyperparameter config of trial {self.trial_id}:",
                *(changes or ["No hyperparameters mutated."]),
            ]
        )


def _at(config: Mapping[str, Any], path: str) -> Any:
    """The value at an operations key (``outer/inner`` for a nested one)."""
    value: Any = config
    for part in path.split("/"):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _score(score: float | None) -> str:
    """Ray's ``{:4f}`` (of the metric's value: Ray shows ``mode="min"`` scores negated)."""
    return "?" if score is None else f"{score:4f}"


@dataclass(frozen=True, eq=False)
class Decision:
    """What to do with the reporting trial, plus effects on other trials.

    Compares equal to an :class:`Action` (or its string) by ``action``, so
    ``decision == TrialScheduler.CONTINUE`` reads as in Ray.

    - ``exploits``: clone-and-explore operations (PBT). The target continues
      from the source's checkpoint with the new config.
    - ``others``: actions for other trials, e.g. a synchronous scheduler
      releasing the paused cohort (CONTINUE) or stopping its losers (STOP).
    """

    action: Action
    exploits: tuple[Exploit, ...] = ()
    others: Mapping[str, Action] = field(default_factory=dict)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Decision):
            return (self.action, self.exploits, dict(self.others)) == (
                other.action,
                other.exploits,
                dict(other.others),
            )
        if isinstance(other, str):  # Action is a str subclass
            return self.action == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.action)

    @classmethod
    def of(cls, value: Action | Decision) -> Decision:
        return value if isinstance(value, Decision) else cls(Action(value))


def score(result: Mapping[str, Any], metric: str, mode: str) -> float:
    """The result's metric as a score to maximise (mode=min is negated)."""
    value = float(result[metric])
    return value if mode == "max" else -value


def is_nan(x: Any) -> bool:
    return isinstance(x, float) and math.isnan(x)


class TrialScheduler:
    """Base class: Ray Tune's ``TrialScheduler`` hooks, returning data."""

    CONTINUE = Action.CONTINUE
    PAUSE = Action.PAUSE
    STOP = Action.STOP

    #: Reduce once per round after every live trial reported (synch PBT,
    #: HyperBand), instead of deciding per result as it arrives.
    synchronous: bool = False
    #: A PAUSE only holds the trial at the round barrier, and every paused trial
    #: goes on (or is cloned) next round (synch PBT): its trainable may stay alive
    #: on its worker. Otherwise (HyperBand's cohorts) a pause can be long and
    #: most paused trials then stop, so their trainables are freed.
    pause_is_barrier: bool = False
    #: Asynchronous only: the trial to run next is chosen when a slot frees, from the
    #: others' progress then (no segment queued ahead of its slot, none packed with
    #: another): asynchronous PBT time-shares the slots among more trials than fit, as
    #: Ray pauses a trial at its perturbation point when others wait, so exploits compare
    #: trials trained alike.
    time_shares_slots: bool = False
    #: Its decisions restore trials from saved state: an exploit clones a trial's
    #: checkpoint (PBT, PB2, PBT replay), or a pause frees the trial's slot until its
    #: cohort is decided (HyperBand). A class trainable without ``save_checkpoint`` is
    #: refused before the run starts under such a scheduler (Ray errors each trial at
    #: its first save instead). FIFO and ASHA only continue or stop trials.
    needs_checkpoints: bool = False
    #: The result key this scheduler measures time in (None: no milestones).
    time_attr: str | None = None
    #: The positional and keyword arguments it was built with: a run keeps its scheduler
    #: as its class and these (JSON where they can be), not as a pickle.
    init_args: tuple[tuple[Any, ...], dict[str, Any]]

    def __new__(cls, *args: Any, **kwargs: Any) -> TrialScheduler:
        self = super().__new__(cls)
        self.init_args = (args, dict(kwargs))
        return self

    @property
    def logs_policy(self) -> bool:
        """Write exploits to ``pbt_global.txt`` and ``pbt_policy_<trial_id>.txt``
        (PBT's ``log_config``)."""
        return True

    def __init__(
        self,
        metric: str | None = None,
        mode: str | None = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        check_mode(mode)
        self._metric = metric
        self._mode = mode
        self._rng = rng if rng is not None else np.random.default_rng()

    # -- configuration -------------------------------------------------------
    @property
    def metric(self) -> str | None:
        return self._metric

    @property
    def mode(self) -> str | None:
        return self._mode

    def set_search_properties(self, metric: str | None, mode: str | None) -> bool:
        """Take metric/mode from ``popflow.run(...)``; False if already set (Ray's contract)."""
        if (self._metric and metric) or (self._mode and mode):
            return False
        check_mode(mode)
        if metric:
            self._metric = metric
        if mode:
            self._mode = mode
        return True

    def set_rng(self, rng: np.random.Generator) -> None:
        """Inject the experiment's generator (``popflow.run`` derives it from ``seed``)."""
        self._rng = rng

    # -- hooks ---------------------------------------------------------------
    def complete_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """A trial's config as the scheduler needs it (PBT samples missing mutation keys).

        Called by the controller before ``on_trial_add``; returns a new dict.
        """
        return dict(config)

    def on_trial_add(self, trial: Trial) -> None:
        pass

    def on_trial_result(self, trial: Trial, result: dict[str, Any]) -> Action | Decision:
        return Action.CONTINUE

    def on_trial_complete(self, trial: Trial, result: dict[str, Any]) -> None:
        pass

    def on_trial_error(self, trial: Trial) -> None:
        pass

    def on_trial_remove(self, trial: Trial) -> None:
        pass

    def release_paused(self) -> Decision | None:
        """Decisions owed to paused trials after a trial left (completed, errored, removed).

        A synchronous scheduler whose cohort waited for the trial that left
        returns the barrier's decision here (its ``others`` release or stop the
        paused trials; ``action`` concerns no trial). None: nothing to do.
        The controller calls it after every ``on_trial_complete``,
        ``on_trial_error`` and ``on_trial_remove``.
        """
        return None

    def choose_trial_to_run(self, trials: Sequence[Trial]) -> Trial | None:
        """Pending trials first, in order; then paused ones, least recently trained first."""
        for trial in trials:
            if trial.status == TrialStatus.PENDING:
                return trial
        paused = [t for t in trials if t.status == TrialStatus.PAUSED]
        return min(paused, key=lambda t: t.last_train_time) if paused else None

    def choose_trials_to_run(self, trials: Sequence[Trial], limit: int | None) -> list[Trial]:
        """Up to ``limit`` trials (None: any number) to run next, in order: what
        ``choose_trial_to_run`` picks when asked again and again, each trial picked
        leaving the candidates. A scheduler may give the same answer faster (PBT sorts
        once: asked once per trial, a 256-member round cost 65,000 comparisons)."""
        picked: list[Trial] = []
        taken: set[str] = set()
        while limit is None or len(picked) < limit:
            chosen = self.choose_trial_to_run(_Without(trials, taken))
            if chosen is None:
                break
            picked.append(chosen)
            taken.add(chosen.trial_id)
        return picked

    def next_milestone(self, trial: Trial) -> float | None:
        """The ``time_attr`` value at which this scheduler next needs the trial's result.

        The controller runs the trial's segment up to (at least) this value,
        so the worker only stops where a decision can be made. None: no limit
        from the scheduler.
        """
        return None

    # -- persistence (plain data, JSON-serialisable) -------------------------
    def get_state(self) -> dict[str, Any]:
        return {
            "metric": self._metric,
            "mode": self._mode,
            "rng": self._rng.bit_generator.state,
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        self._metric = state["metric"]
        self._mode = state["mode"]
        self._rng.bit_generator.state = state["rng"]

    def debug_string(self) -> str:
        return type(self).__name__


class _Without(Sequence[Trial]):
    """``trials`` less those whose ids are in ``taken``, read lazily (the candidates of a
    large run are many; a FIFO pick reads the first few)."""

    def __init__(self, trials: Sequence[Trial], taken: set[str]) -> None:
        self._trials, self._taken = trials, taken

    def __iter__(self) -> Iterator[Trial]:
        return (t for t in self._trials if t.trial_id not in self._taken)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __getitem__(self, i: Any) -> Any:
        return list(self)[i]


class FIFOScheduler(TrialScheduler):
    """Runs trials in order to completion; never pauses or stops them early."""

    def debug_string(self) -> str:
        return "Using FIFO scheduling algorithm."
