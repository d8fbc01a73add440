"""Ray's ``ConcurrencyLimiter``: at most ``max_concurrent`` of a searcher's trials live."""

from __future__ import annotations

import logging
from typing import Any

from popflow.schedulers.search.searcher import Searcher

logger = logging.getLogger(__name__)


class ConcurrencyLimiter(Searcher):
    """Suggests through ``searcher`` while fewer than ``max_concurrent`` of its trials are
    live; with ``batch``, only once the whole batch of ``max_concurrent`` has ended."""

    def __init__(self, searcher: Searcher, max_concurrent: int, batch: bool = False) -> None:
        if not isinstance(searcher, Searcher):
            raise TypeError(f"`searcher` is {searcher!r}, but must be a Searcher")
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int):
            raise TypeError(f"`max_concurrent` is {max_concurrent!r}, but must be an int >= 1")
        if max_concurrent < 1:
            raise ValueError(f"`max_concurrent` is {max_concurrent}, but must be >= 1")
        super().__init__(metric=searcher.metric, mode=searcher.mode)
        self.searcher = searcher
        self.max_concurrent = max_concurrent
        self.batch = batch
        self.live_trials: set[str] = set()
        self.num_unfinished_live_trials = 0
        self.cached_results: dict[str, tuple[dict[str, Any] | None, bool]] = {}
        #: False where the searcher keeps the limit itself (``set_max_concurrency``)
        self._limit_concurrency = True

    @property
    def metric(self) -> str | None:
        return self.searcher.metric

    @property
    def mode(self) -> str | None:
        return self.searcher.mode

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        # as Ray: a searcher with its own rule for the limit (TuneBOHB) takes it over
        self._limit_concurrency = not self.searcher.set_max_concurrency(self.max_concurrent)
        return self.searcher.set_search_properties(metric, mode, config, **spec)

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        self.max_concurrent = max_concurrent
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if self._limit_concurrency and len(self.live_trials) >= self.max_concurrent:
            return None
        suggestion = self.searcher.suggest(trial_id)
        if isinstance(suggestion, dict):
            self.live_trials.add(trial_id)
            self.num_unfinished_live_trials += 1
        return suggestion

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        if trial_id in self.live_trials:
            self.searcher.on_trial_result(trial_id, result)

    def on_pause(self, trial_id: str) -> None:
        self.searcher.on_pause(trial_id)

    def on_unpause(self, trial_id: str) -> None:
        self.searcher.on_unpause(trial_id)

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        if trial_id not in self.live_trials:
            return
        if not self.batch:
            self.searcher.on_trial_complete(trial_id, result=result, error=error)
            self.live_trials.discard(trial_id)
            self.num_unfinished_live_trials -= 1
            return
        # a batch tells its searcher of its trials once all of them ended, in order
        self.cached_results[trial_id] = (result, error)
        self.num_unfinished_live_trials -= 1
        if self.num_unfinished_live_trials <= 0:
            for done in sorted(self.cached_results):
                done_result, done_error = self.cached_results[done]
                self.searcher.on_trial_complete(done, result=done_result, error=done_error)
            self.live_trials.clear()
            self.cached_results.clear()
            self.num_unfinished_live_trials = 0
