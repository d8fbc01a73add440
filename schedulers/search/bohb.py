"""Ray's ``TuneBOHB``: BOHB's model (:mod:`popflow.schedulers.search.bohb_model`, whose
notes say how it follows hpbandster and where it differs) as a search algorithm, with
:class:`~popflow.schedulers.hb_bohb.HyperBandForBOHB` as its scheduler."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from popflow.schedulers import domains
from popflow.schedulers.search.bohb_model import BOHBModel, convert_search_space
from popflow.schedulers.search.searcher import DEFAULT_METRIC, Searcher
from popflow.schedulers.search_space import flat_keys, nested_keys

logger = logging.getLogger(__name__)

__all__ = ["BOHBModel", "TuneBOHB", "convert_search_space"]


# -- Ray's TuneBOHB -------------------------------------------------------------------------
class TuneBOHB(Searcher):
    """Ray's ``ray.tune.search.bohb.TuneBOHB``: BOHB's model, to be used with
    :class:`~popflow.schedulers.hb_bohb.HyperBandForBOHB`.

    ``space``: popflow search spaces by name (nested dicts or ``"a/b"`` names), or None
    to take the run's ``param_space`` (a ConfigSpace ``ConfigurationSpace`` is refused:
    ConfigSpace and hpbandster are not used). ``bohb_config``: hpbandster's ``BOHB``
    arguments (``min_points_in_model``, ``top_n_percent``, ``num_samples``,
    ``random_fraction``, ``bandwidth_factor``, ``min_bandwidth``). ``metric``/``mode``:
    Ray's. ``points_to_evaluate``: configs suggested first. ``seed``: the model's seed
    (None: the run's). ``max_concurrent``: at most this many of its trials running (paused
    ones not counted, once told of pauses through :meth:`on_pause`); <= 0: no limit.
    ``time_attr`` (popflow's): the result key whose value is a result's budget where the
    result has no ``hyperband_info`` (see :mod:`popflow.schedulers.search.bohb_model`).
    """

    def __init__(
        self,
        space: Mapping[str, Any] | None = None,
        bohb_config: dict[str, Any] | None = None,
        metric: str | None = None,
        mode: str | None = None,
        points_to_evaluate: list[dict[str, Any]] | None = None,
        seed: int | None = None,
        max_concurrent: int = 0,
        *,
        time_attr: str = "training_iteration",
    ) -> None:
        super().__init__(metric=metric, mode=mode)
        if isinstance(mode, list | tuple):
            raise ValueError(f"`mode` is {mode!r}, but must be 'min' or 'max' (one objective)")
        if space is not None and type(space).__module__.split(".")[0] == "ConfigSpace":
            raise TypeError(
                "TuneBOHB takes popflow search spaces, not a ConfigSpace ConfigurationSpace "
                "(popflow's BOHB does not use ConfigSpace or hpbandster): pass them as the "
                "run's `param_space`, e.g. {'width': tune.uniform(0, 20), 'activation': "
                "tune.choice(['relu', 'tanh'])}, or as `space`"
            )
        if space is not None and not isinstance(space, Mapping):
            raise TypeError(f"`space` is {space!r}, but must be a dict of search spaces or None")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"`seed` is {seed!r}, but must be an int or None")
        if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int):
            raise TypeError(f"`max_concurrent` is {max_concurrent!r}, but must be an int")
        if points_to_evaluate is not None and not isinstance(points_to_evaluate, list | tuple):
            raise ValueError(
                f"`points_to_evaluate` is {type(points_to_evaluate).__name__}, but must be a "
                "list of points (dicts)"
            )
        self._bohb_config = dict(bohb_config or {})
        self._space: dict[str, domains.Domain] | None = None
        if space:
            logger.warning(
                "TuneBOHB got popflow search spaces as `space`: they are converted, but "
                "pass them as the run's `param_space` instead (Ray's advice)"
            )
            self._space = convert_search_space(space)
        self._seed = seed
        self._run_seed: int | None = None
        self._max_concurrent = max_concurrent
        self._points = [flat_keys(dict(p)) for p in points_to_evaluate or []]
        if self._space:
            self._check(self._space)  # a bad bohb_config or point named now
        self.trial_to_params: dict[str, np.ndarray] = {}
        self.running: set[str] = set()
        self.paused: set[str] = set()
        self.bohber: BOHBModel | None = None  # made on first use
        self._rng: np.random.Generator | None = None
        self._metric_op = 1.0
        self.time_attr = time_attr

    # -- Ray's protocol -------------------------------------------------------------------
    def set_max_concurrency(self, max_concurrent: int) -> bool:
        self._max_concurrent = max_concurrent
        return True

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        """The run's metric, mode and seed where this searcher has none; its
        ``param_space`` as the space unless the searcher has its own (then False)."""
        self.take_run_metric(metric, mode)
        if spec.get("seed") is not None:
            self._run_seed = int(spec["seed"])
        if self._space:
            return False
        space = convert_search_space(config)
        if not space:
            raise ValueError(
                "TuneBOHB has no search space: pass `space`, or a `param_space` with search "
                "spaces (tune.uniform(...), tune.choice([...]), ...) to the run"
            )
        self._check(space)
        self._space = space
        return True

    def _check(self, space: dict[str, domains.Domain]) -> None:
        model = BOHBModel(space, **self._bohb_config)
        for point in self._points:
            model.vector(point)

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        self._setup()
        assert self.bohber is not None and self._rng is not None
        limit = self._max_concurrent if self._max_concurrent > 0 else math.inf
        if len(self.running) >= limit:
            return None
        if self._points:
            flat = self._points.pop(0)
            vector = self.bohber.vector(flat)
            config = dict(flat)
        else:
            vector = self.bohber.get_vector(self._rng)
            config = self.bohber.config(vector)
        self.trial_to_params[trial_id] = vector
        self.running.add(trial_id)
        return nested_keys(config)

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        if trial_id not in self.paused:
            self.running.add(trial_id)
        vector = self.trial_to_params.get(trial_id)
        if vector is None or self.bohber is None:
            return
        info = result.get("hyperband_info")
        # Ray's HyperBandForBOHB puts a budget in the results at a milestone only
        budget = info.get("budget") if isinstance(info, Mapping) else result.get(self.time_attr)
        value = result.get(self.metric) if self.metric else None
        if budget is None or not _real(budget) or not _real(value):
            return
        self.bohber.new_result(vector, self._metric_op * float(value), float(budget))

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        self.trial_to_params.pop(trial_id, None)
        self.paused.discard(trial_id)
        self.running.discard(trial_id)

    def on_pause(self, trial_id: str) -> None:
        """Ray's hook for ``HyperBandForBOHB``: a paused trial does not count as running."""
        self.paused.add(trial_id)
        self.running.discard(trial_id)

    def on_unpause(self, trial_id: str) -> None:
        self.paused.discard(trial_id)
        self.running.add(trial_id)

    @staticmethod
    def convert_search_space(spec: dict[str, Any]) -> dict[str, domains.Domain]:
        return convert_search_space(spec)

    # -- the model --------------------------------------------------------------------------
    def _setup(self) -> None:
        """The model and its generator, made on first use (once the run told its metric,
        mode and seed)."""
        if self.bohber is not None:
            return
        if self._metric is None and self._mode:
            self._metric = DEFAULT_METRIC
        if not self._space:
            raise RuntimeError(
                "TuneBOHB has no search space: pass `space`, or a `param_space` with search "
                "spaces to the run"
            )
        if not self._metric or not self._mode:
            raise RuntimeError(
                f"TuneBOHB has metric={self._metric!r} and mode={self._mode!r}: pass both to "
                "it, or to the run"
            )
        self._metric_op = -1.0 if self._mode == "max" else 1.0
        self.bohber = BOHBModel(self._space, **self._bohb_config)
        seed = self._seed if self._seed is not None else self._run_seed
        self._rng = np.random.default_rng(seed)


def _real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
