"""A run's search algorithm on the driver: asked for each new trial while there is room,
told of every result and every trial's end, its calls committed with the rounds.

Ray's ``Searcher`` keeps its model in memory and Ray pickles it beside the experiment
now and then; a resume restores whatever was pickled last. Here the calls the driver
made to the searcher (each suggestion with its config, each result, each end, each pause and unpause) are part
of the round's commit (``search_calls``, a list that only grows, so a commit writes the
new calls only). A resume makes the searcher afresh, as the script does, and replays
those calls: its model is the one the committed rounds built, and a seeded searcher
suggests what an uninterrupted run would have. A suggestion that comes out otherwise
on replay (a searcher that is not deterministic) is warned about, and the committed
config stands.

Ray's rules: ``num_samples`` bounds the trials a searcher suggests (a
``BasicVariantGenerator`` bounds itself); ``None`` from :meth:`Searcher.suggest` means
not now, ``FINISHED`` never again; at most ``max(16, slots)`` suggested trials wait
unstarted (Ray's ``max_pending_trials``).
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from popflow.flows.experiment.trial_table import TrialRecord
from popflow.infra.jsonutil import jsonable
from popflow.schedulers import Trial
from popflow.schedulers.search import FINISHED, BasicVariantGenerator
from popflow.schedulers.search.basic_variant import with_point
from popflow.schedulers.search_space import has_search_spaces
from popflow.schedulers.variants import format_vars
from popflow.tasks.seeding import searcher_seed

if TYPE_CHECKING:
    from popflow.flows.spec.run_spec import RunSpec

logger = logging.getLogger(__name__)

#: Ray's floor on suggested trials waiting to start.
MAX_PENDING = 16


class Suggestions:
    """``spec.search_alg`` for one driver: :meth:`fill` adds trials through ``make`` (the
    record of the n-th trial from its config and tag) and ``add`` (into the run)."""

    def __init__(
        self,
        spec: RunSpec,
        seed: int,
        resumed: dict[str, Any] | None,
        make: Callable[[int, dict[str, Any], str], TrialRecord],
        add: Callable[[TrialRecord], None],
    ) -> None:
        # a copy: the script's searcher stays as it was made, for a retry or a resume in
        # the same process to start from (and replay onto) a fresh one
        self.searcher = copy.deepcopy(spec.search_alg)
        self._space = dict(spec.param_space)
        self._make, self._add = make, add
        self._cap = spec.num_samples if self.searcher.bounded_by_num_samples else None
        metric = spec.tune_config.metric or spec.metric
        mode = spec.tune_config.mode or spec.mode
        self.searcher.set_search_properties(
            metric,
            mode,
            dict(spec.param_space),
            num_samples=spec.num_samples,
            seed=searcher_seed(seed),
        )
        state = (resumed or {}).get("search") or {}
        self.created: int = state.get("created", 0)
        self.finished: bool = state.get("finished", False)
        self.calls: list[list[Any]] = []
        self._waiting: set[str] = set(state.get("waiting", []))  # suggested, not started
        self._paused: set[str] = set()  # told on_pause, not yet on_unpause or ended
        self._replay((resumed or {}).get("search_calls") or [])

    # -- the driver's side ---------------------------------------------------------
    def more(self) -> bool:
        """The searcher may still add trials."""
        return not self.finished and (self._cap is None or self.created < self._cap)

    def fill(self, slots: int, new_id: Callable[[int], str]) -> int:
        """Ask for new trials while there is room; how many were added."""
        added = 0
        while self.more() and len(self._waiting) < max(MAX_PENDING, slots):
            trial_id = new_id(self.created)
            suggestion = self.searcher.suggest(trial_id)
            if suggestion is None:
                break
            if suggestion == FINISHED:
                self.finished = True
                self.calls.append(["f"])
                break
            if not isinstance(suggestion, dict):
                raise TypeError(
                    f"{type(self.searcher).__name__}.suggest returned {suggestion!r}; a "
                    "searcher returns a config (dict), None or Searcher.FINISHED"
                )
            self.calls.append(["s", trial_id, jsonable(suggestion)])
            config = with_point(self._space, suggestion)  # the space's constants, and the rest
            if has_search_spaces(config):
                raise ValueError(
                    f"{type(self.searcher).__name__} suggested {suggestion!r}, which leaves "
                    "search spaces of `param_space` unsampled: give them all to the searcher"
                )
            rec = self._make(self.created, config, self._tag(trial_id, suggestion))
            # Ray's: the suggestion flattened, then what the scheduler added
            rec.trial.evaluated_params = {**_flatten(suggestion), **rec.trial.evaluated_params}
            if rec.trial_id != trial_id:
                raise AssertionError(f"trial {rec.trial_id} made for suggestion {trial_id}")
            self.created += 1
            self._waiting.add(trial_id)
            self._add(rec)
            added += 1
        return added

    def started(self, trial_id: str) -> None:
        """``trial_id`` runs (again): a paused trial is unpaused (Ray's ``on_unpause``)."""
        self._waiting.discard(trial_id)
        if trial_id in self._paused:
            self._paused.discard(trial_id)
            self.calls.append(["u", trial_id])
            self.searcher.on_unpause(trial_id)

    def paused(self, trial_id: str) -> None:
        """The scheduler paused ``trial_id`` (Ray's ``on_pause``)."""
        if trial_id not in self._paused:
            self._paused.add(trial_id)
            self.calls.append(["p", trial_id])
            self.searcher.on_pause(trial_id)

    def _tag(self, trial_id: str, config: dict[str, Any]) -> str:
        if isinstance(self.searcher, BasicVariantGenerator):
            tag = self.searcher.tag(trial_id)
            if tag is not None:
                return tag
        flat = _flatten(config)
        formatted = format_vars({tuple(k.split("/")): v for k, v in flat.items()})
        return f"{self.created}_{formatted}" if formatted else str(self.created)

    # -- told by the run (through its hooks) ----------------------------------------
    def trial_result(self, trial: Trial, result: dict[str, Any]) -> None:
        told = jsonable({k: v for k, v in result.items() if k != "config"})
        self.calls.append(["r", trial.trial_id, told])
        self.searcher.on_trial_result(trial.trial_id, told)

    def trial_complete(self, trial: Trial) -> None:
        self._end(trial, error=False)

    def trial_error(self, trial: Trial) -> None:
        self._end(trial, error=True)

    def _end(self, trial: Trial, error: bool) -> None:
        self._waiting.discard(trial.trial_id)
        self._paused.discard(trial.trial_id)
        last = trial.last_result or None
        told = jsonable({k: v for k, v in last.items() if k != "config"}) if last else None
        self.calls.append(["c", trial.trial_id, told, error])
        self.searcher.on_trial_complete(trial.trial_id, result=told, error=error)

    # -- committed -----------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "created": self.created,
            "finished": self.finished,
            "more": self.more(),  # the experiment is not over while it may add trials
            "waiting": sorted(self._waiting),
        }

    def _replay(self, calls: list[list[Any]]) -> None:
        """The committed calls, made again to the fresh searcher."""
        differed = 0
        for call in calls:
            kind = call[0]
            if kind == "s":
                got = self.searcher.suggest(call[1])
                if not isinstance(got, dict) or _canonical(got) != _canonical(call[2]):
                    differed += 1
            elif kind == "r":
                self.searcher.on_trial_result(call[1], call[2])
            elif kind == "c":
                self._paused.discard(call[1])
                self.searcher.on_trial_complete(call[1], result=call[2], error=call[3])
            elif kind == "p":
                self._paused.add(call[1])
                self.searcher.on_pause(call[1])
            elif kind == "u":
                self._paused.discard(call[1])
                self.searcher.on_unpause(call[1])
            self.calls.append(call)
        if differed:
            logger.warning(
                "%s suggested other configs on resume than it had (%d of them): it is not "
                "deterministic given its seed and its calls, so the resumed run's new "
                "suggestions may differ from an uninterrupted run's",
                type(self.searcher).__name__,
                differed,
            )


def _canonical(config: dict[str, Any]) -> str:
    return json.dumps(jsonable(config), sort_keys=True)


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, path + "/"))
        else:
            out[path] = value
    return out
