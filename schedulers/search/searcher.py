"""Ray's ``Searcher``: what suggests each new trial's config, told of every result.

A searcher is asked for a config when the driver has room for a new trial
(:meth:`Searcher.suggest`), and told of the trial's results and its end
(:meth:`Searcher.on_trial_result`, :meth:`Searcher.on_trial_complete`). It returns
``None`` when it has nothing to suggest now (a :class:`ConcurrencyLimiter` that is
full), and :data:`FINISHED` when it never will again: sampling ends there.

popflow commits the calls a run made to its searcher (not a pickle on the side):
a resumed run makes a fresh searcher the same way and replays them, so its model,
and for a seeded run its suggestions, are those of a run never interrupted
(:mod:`popflow.flows.driver.suggestions`).
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

#: What :meth:`Searcher.suggest` returns when it will suggest nothing more.
FINISHED = "FINISHED"
#: the metric a searcher given only a ``mode`` optimises (Ray's ``DEFAULT_METRIC``)
DEFAULT_METRIC = "_metric"


class Searcher:
    """Ray's ``tune.search.Searcher``: subclass it and implement :meth:`suggest` (and
    :meth:`on_trial_complete` to learn from results)."""

    FINISHED = FINISHED
    CKPT_FILE_TMPL = "searcher-state-{}.pkl"
    #: the run's ``num_samples`` bounds the trials suggested (a generator may bound itself)
    bounded_by_num_samples = True

    def __init__(self, metric: str | None = None, mode: str | None = None) -> None:
        check_mode(mode)
        self._metric = metric
        self._mode = mode

    @property
    def metric(self) -> str | None:
        return self._metric

    @property
    def mode(self) -> str | None:
        return self._mode

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        """Take the run's ``metric``, ``mode`` and ``param_space`` (``config``) where the
        searcher has none of its own; False: it cannot (Ray's contract)."""
        return False

    def take_run_metric(self, metric: str | None, mode: str | None) -> None:
        """The run's ``metric`` and ``mode`` where this searcher was given none (Ray's
        ``set_search_properties`` rule, which every adapter follows)."""
        if self._metric is None and metric:
            self._metric = metric
        if self._mode is None and mode:
            self._mode = mode

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        """The config of the new trial ``trial_id``; None: not now; :data:`FINISHED`: never
        again."""
        raise NotImplementedError(f"{type(self).__name__} must implement suggest()")

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        """One intermediate result of ``trial_id``."""

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        """``trial_id`` ended: with its last ``result``, or with an ``error``."""

    def on_pause(self, trial_id: str) -> None:
        """The scheduler paused ``trial_id`` (HyperBand between rungs, PBT's time-sharing):
        it holds no slot until :meth:`on_unpause`."""

    def on_unpause(self, trial_id: str) -> None:
        """``trial_id``, paused, runs again."""

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        """A ``ConcurrencyLimiter``'s limit; True: this searcher keeps it itself (counting
        paused trials out, say), so the limiter does not."""
        return False

    def add_evaluated_point(
        self,
        parameters: dict[str, Any],
        value: float,
        error: bool = False,
        pruned: bool = False,
        intermediate_values: list[float] | None = None,
    ) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not take evaluated points")

    # Ray's side files, for a user's code that calls them; popflow's resume does not
    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as f:
            pickle.dump(self.__dict__, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            self.__dict__.update(pickle.load(f))

    def save_to_dir(self, checkpoint_dir: str, session_str: str = "default") -> None:
        self.save(str(Path(checkpoint_dir) / self.CKPT_FILE_TMPL.format(session_str)))

    def restore_from_dir(self, checkpoint_dir: str) -> None:
        found = sorted(Path(checkpoint_dir).glob(self.CKPT_FILE_TMPL.format("*")))
        if not found:
            raise RuntimeError(f"no searcher state in {checkpoint_dir}")
        self.restore(str(found[-1]))


def check_mode(mode: Any) -> None:
    """A searcher's ``mode``: 'min', 'max', None, or (multi-objective) a list of them."""
    modes = mode if isinstance(mode, list | tuple) else [mode]
    for m in modes:
        if m not in (None, "min", "max"):
            raise ValueError(f"`mode` is {mode!r}, but must be 'min' or 'max'")


def check_searcher(search_alg: Any) -> Any:
    """``search_alg`` as given, or a clear error naming what it is."""
    if search_alg is None or isinstance(search_alg, Searcher):
        return search_alg
    raise TypeError(
        f"`search_alg` is {search_alg!r} ({type(search_alg).__name__}), but must be a "
        "popflow.tune.search.Searcher (OptunaSearch, BasicVariantGenerator, your own subclass, "
        "...) or None"
    )
