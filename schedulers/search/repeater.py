"""Ray's ``Repeater``: each suggested config trained ``repeat`` times, the searcher told
their mean, so a noisy objective is judged on its average."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from popflow.schedulers.search.searcher import Searcher

logger = logging.getLogger(__name__)

#: The key Ray's Repeater sets in each repeat's config (``set_index=True``).
TRIAL_INDEX = "__trial_index__"


class Repeater(Searcher):
    """Repeats each of ``searcher``'s configs ``repeat`` times; ``set_index`` adds each
    repeat's index to its config as ``__trial_index__`` (a seed for the trainable)."""

    def __init__(self, searcher: Searcher, repeat: int = 1, set_index: bool = True) -> None:
        if not isinstance(searcher, Searcher):
            raise TypeError(f"`searcher` is {searcher!r}, but must be a Searcher")
        if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
            raise ValueError(f"`repeat` is {repeat!r}, but must be an int >= 1")
        super().__init__(metric=searcher.metric, mode=searcher.mode)
        self.searcher = searcher
        self.repeat = repeat
        self._set_index = set_index
        self._groups: list[dict[str, Any]] = []  # primary id, config, members, scores
        self._group_of: dict[str, int] = {}

    @property
    def metric(self) -> str | None:
        return self.searcher.metric

    @property
    def mode(self) -> str | None:
        return self.searcher.mode

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        samples = spec.get("num_samples")
        if isinstance(samples, int) and samples > 0 and samples % self.repeat:
            logger.warning(
                "num_samples (%d) is not a multiple of Repeater's repeat (%d): the last "
                "config is repeated fewer times",
                samples,
                self.repeat,
            )
        return self.searcher.set_search_properties(metric, mode, config, **spec)

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        group = self._groups[-1] if self._groups else None
        if group is None or len(group["members"]) >= self.repeat:
            config = self.searcher.suggest(trial_id)
            if not isinstance(config, dict):
                return config
            group = {"primary": trial_id, "config": config, "members": [], "scores": {}}
            self._groups.append(group)
        index = len(group["members"])
        group["members"].append(trial_id)
        self._group_of[trial_id] = len(self._groups) - 1
        config = dict(group["config"])
        if self._set_index:
            config[TRIAL_INDEX] = index
        return config

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        if trial_id not in self._group_of:
            return
        group = self._groups[self._group_of[trial_id]]
        score = None if error or not result else result.get(self.searcher.metric)
        group["scores"][trial_id] = score
        if len(group["scores"]) < self.repeat:
            return
        values = [s for s in group["scores"].values() if s is not None]
        if values:
            self.searcher.on_trial_complete(
                group["primary"], result={self.searcher.metric: float(np.mean(values))}
            )
        else:
            self.searcher.on_trial_complete(group["primary"], error=True)
