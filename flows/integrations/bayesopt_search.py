"""Ray's ``BayesOptSearch`` over the real ``bayes_opt`` (fmfn/BayesianOptimization 1.4): a
Gaussian process over continuous parameters, each new config where its acquisition
function (UCB by default) is highest.

    from popflow.tune.search.bayesopt import BayesOptSearch
    tuner = tune.Tuner(train, param_space={"width": tune.uniform(0, 20)},
                       tune_config=tune.TuneConfig(search_alg=BayesOptSearch(),
                                                   metric="loss", mode="min", num_samples=30))

Needs the ``bayesopt`` extra (``pip install 'popflow[bayesopt]'``). As in Ray: only
float parameters (a log-uniform one is searched uniformly between its bounds), the first
``random_search_steps`` configs at random and their results told to the process together,
a config suggested again skipped, and the search ``FINISHED`` once one came up more than
``patience`` times; ``random_state`` is 42 unless given.

Every suggestion draws its random numbers from a seed made of ``random_state``, the
configs suggested so far and the results the process holds (not from one stream that
every call advances): it is the same whatever calls returned None meanwhile, which a
resumed run does not replay (:mod:`popflow.flows.driver.suggestions`).
"""

from __future__ import annotations

import copy
import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from popflow.flows.integrations.search_values import is_number, metric_of
from popflow.infra.optional_imports import require
from popflow.schedulers import domains
from popflow.schedulers.search import Searcher
from popflow.schedulers.search_space import flat_keys, is_grid_search, nested_keys
from popflow.tasks.result_keys import DEFAULT_METRIC

logger = logging.getLogger(__name__)

#: bayes_opt's own defaults for its acquisition function, as Ray's
DEFAULT_UTILITY = {"kind": "ucb", "kappa": 2.576, "xi": 0.0}


class BayesOptSearch(Searcher):
    """Ray's ``ray.tune.search.bayesopt.BayesOptSearch``.

    ``space``: ``(lower, upper)`` bounds by name (nested dicts, or ``"a/b"`` names), or
    None to take the run's ``param_space`` (uniform and log-uniform floats only).
    ``metric``/``mode``: Ray's. ``points_to_evaluate``: configs tried first.
    ``utility_kwargs``: ``bayes_opt.UtilityFunction``'s (``kind``, ``kappa``, ``xi``).
    ``random_state``: the seed (42 as in Ray; None: the run's). ``random_search_steps``:
    random configs before the process takes over. ``patience``/``skip_duplicate``: a
    config suggested again is skipped (None: not now); one suggested more than
    ``patience`` times ends the search. ``analysis``: a previous run's results (its
    ``ResultGrid``) told to the process first. ``repeat_float_precision``: the decimals
    two configs must share to count as one.
    """

    def __init__(
        self,
        space: Mapping[str, Any] | None = None,
        metric: str | None = None,
        mode: str | None = None,
        points_to_evaluate: list[dict[str, Any]] | None = None,
        utility_kwargs: dict[str, Any] | None = None,
        random_state: int | np.random.RandomState | None = 42,
        random_search_steps: int = 10,
        verbose: int = 0,
        patience: int = 5,
        skip_duplicate: bool = True,
        analysis: Any = None,
        repeat_float_precision: int = 5,
    ) -> None:
        byo = _bayes_opt()
        super().__init__(metric=metric, mode=mode)
        if isinstance(patience, bool) or not isinstance(patience, int) or patience <= 0:
            raise ValueError(f"`patience` is {patience!r}, but must be an int > 0")
        if (
            isinstance(repeat_float_precision, bool)
            or not isinstance(repeat_float_precision, int)
            or repeat_float_precision < 0
        ):
            raise ValueError(
                f"`repeat_float_precision` is {repeat_float_precision!r}, but must be an int >= 0"
            )
        if (
            isinstance(random_search_steps, bool)
            or not isinstance(random_search_steps, int)
            or random_search_steps < 0
        ):
            raise ValueError(
                f"`random_search_steps` is {random_search_steps!r}, but must be an int >= 0"
            )
        if points_to_evaluate is not None and (
            not isinstance(points_to_evaluate, Sequence) or isinstance(points_to_evaluate, str)
        ):
            raise ValueError(
                f"`points_to_evaluate` is {type(points_to_evaluate).__name__}, but must be a "
                "list of points (dicts)"
            )
        self.utility_kwargs = dict(DEFAULT_UTILITY if utility_kwargs is None else utility_kwargs)
        # made here, as Ray, so that a bad `kind` or argument is named at once
        self.utility = byo.UtilityFunction(**self.utility_kwargs)
        if space is not None and not isinstance(space, Mapping):
            raise TypeError(f"`space` is {space!r}, but must be a dict of (lower, upper) bounds")
        self._space: dict[str, tuple[float, float]] | None = (
            _bounds_of(dict(space)) if space else None
        )
        self._base_seed = _base_seed(random_state)
        self._random_state = random_state
        self.random_search_trials = random_search_steps
        self.repeat_float_precision = repeat_float_precision
        self._patience = patience
        self._skip_duplicate = skip_duplicate
        self._verbose = verbose
        self._analysis = analysis
        self._points = [flat_keys(dict(p)) for p in points_to_evaluate or []]
        self.optimizer: Any = None  # bayes_opt's BayesianOptimization, made on first use
        self._observed: list[tuple[dict[str, float], float]] = []  # what it was told
        self._config_counter: dict[str, int] = {}
        self._live: dict[str, dict[str, Any]] = {}
        self._buffered: list[tuple[dict[str, Any], float]] = []  # the random phase's results
        self._random_done = random_search_steps == 0
        self._total_random_search_trials = 0
        self._suggested = 0
        self._warned: set[str] = set()

    # -- Ray's protocol -------------------------------------------------------------
    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        """The run's metric and mode where this searcher has none (and its seed, with
        ``random_state=None``); its ``param_space`` as the space unless the searcher has
        its own (then False)."""
        self.take_run_metric(metric, mode)
        if self._base_seed is None and spec.get("seed") is not None:
            self._base_seed = int(spec["seed"])
        if self._space is not None:
            return False
        self._space = convert_search_space(config) or None
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        self._setup()
        if not self._random_done and self._total_random_search_trials >= (
            self.random_search_trials
        ):
            if self._live:
                return None  # the process takes over once the random configs' results came
            # nothing live will ever fill the random phase (some failed): start with what came
            self._end_random_phase()
        attempt = 0  # the process's asks that came out duplicates, in this call
        while True:
            from_points = bool(self._points)
            config = self._points.pop(0) if from_points else self._ask(attempt)
            key = _config_key(config, self.repeat_float_precision)
            seen = key in self._config_counter
            self._config_counter[key] = self._config_counter.get(key, 0) + 1
            if max(self._config_counter.values()) > self._patience:
                self._warn_once(
                    "finished",
                    "BayesOptSearch stops: a config was suggested more than `patience` (%d) "
                    "times, so the process has likely converged. Raise `patience`, set "
                    "`skip_duplicate=False` or widen the space to run more trials",
                    self._patience,
                )
                return Searcher.FINISHED
            if not (seen and self._skip_duplicate):
                break
            self._warn_once(
                "duplicate",
                "BayesOptSearch skips configs it suggested before (the process has likely "
                "converged); once one comes up more than `patience` (%d) times the search ends",
                self._patience,
            )
            logger.info("BayesOptSearch skips the duplicated config %s", config)
            if from_points:
                continue  # a point given twice stays a duplicate: the next one now
            if self._live:
                return None  # a result to come may move the process elsewhere
            # nothing live: no result will change the process, so ask again now (Ray asks
            # again on its next step; here no next ask would come)
            attempt += 1
        if not self._random_done:
            self._total_random_search_trials += 1
        self._live[trial_id] = config
        self._suggested += 1
        return nested_keys(dict(config))

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        params = self._live.pop(trial_id, None)
        # Ray learns nothing from a failed trial (its result is None there)
        if params is None or result is None or error:
            return
        value = metric_of(result, self.metric)
        if not self._random_done:
            self._buffered.append((params, value))
            if len(self._buffered) >= self.random_search_trials:
                self._end_random_phase()
            return
        self._register(params, value)

    def register_analysis(self, analysis: Iterable[Any]) -> None:
        """A previous run's results (a ``ResultGrid``: each result's ``config`` and
        ``metrics``) told to the process."""
        self._setup()
        for result in analysis:
            flat = flat_keys(dict(result.config or {}))
            params = {name: flat.get(name) for name in self._space or {}}
            if all(is_number(v) for v in params.values()):
                self._register(params, metric_of(result.metrics or {}, self.metric))

    # -- the process ----------------------------------------------------------------
    def _setup(self) -> None:
        """The optimizer, made on first use (once the run told its metric and mode)."""
        if self.optimizer is not None:
            return
        if self._metric is None and self._mode:
            self._metric = DEFAULT_METRIC
        if not self._space:
            raise RuntimeError(
                "BayesOptSearch has no search space: pass `space`, or a `param_space` with "
                "search spaces to the run"
            )
        if not self._metric or not self._mode:
            raise RuntimeError(
                f"BayesOptSearch has metric={self._metric!r} and mode={self._mode!r}: pass "
                "both to it, or to the run"
            )
        for point in self._points:
            missing = [name for name in self._space if name not in point]
            if missing:
                raise ValueError(
                    f"a point of `points_to_evaluate` ({nested_keys(point)!r}) has no value for "
                    f"{missing}"
                )
        self.optimizer = self._new_optimizer(self._base_seed)
        if self._analysis is not None:
            self.register_analysis(self._analysis)

    def _new_optimizer(self, seed: int | None) -> Any:
        return _bayes_opt().BayesianOptimization(
            f=None, pbounds=dict(self._space or {}), verbose=self._verbose, random_state=seed
        )

    def _ask(self, attempt: int) -> dict[str, Any]:
        """The acquisition function's best config, from a process that holds what this one
        was told and draws from a seed of the calls so far (see the module's notes)."""
        entropy = [self._suggested, len(self._observed), attempt]
        if self._base_seed is not None:
            entropy.insert(0, self._base_seed)
        seed = np.random.SeedSequence(entropy).generate_state(1)[0]
        probe = self._new_optimizer(int(seed) if self._base_seed is not None else None)
        for params, target in self._observed:
            probe.register(params, target)
        return {name: float(value) for name, value in probe.suggest(self.utility).items()}

    def _end_random_phase(self) -> None:
        self._random_done = True
        for params, value in self._buffered:
            self._register(params, value)
        self._buffered = []

    def _register(self, params: dict[str, Any], value: Any) -> None:
        """One result told to the process: bayes_opt maximises, so "min" is negated."""
        if not is_number(value) or not math.isfinite(float(value)):
            # Ray filters NaN and infinities out, and never gets a result without its metric
            logger.debug("BayesOptSearch: %r of %s is not told", value, params)
            return
        target = float(value) if self._mode == "max" else -float(value)
        params = {name: float(params[name]) for name in self._space or {}}
        try:
            self.optimizer.register(params, target)
        except _bayes_opt().util.NotUniqueError:
            # the same point twice (skip_duplicate=False, or a point given again): the
            # process keeps the first, where Ray's would raise
            logger.debug("BayesOptSearch: %s was told already", params)
            return
        self._observed.append((params, target))

    def _warn_once(self, what: str, message: str, *args: Any) -> None:
        if what not in self._warned:
            self._warned.add(what)
            logger.warning(message, *args)


def convert_search_space(space: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """popflow's (Ray's) search space as bayes_opt's ``(lower, upper)`` bounds by
    ``/``-joined name; constants are left to the run's ``param_space``."""
    out: dict[str, tuple[float, float]] = {}
    for name, domain in flat_keys(space).items():
        if is_grid_search(domain):
            raise ValueError(
                f"`{name}` is a grid_search, which BayesOpt cannot sample: use uniform(...)"
            )
        if not isinstance(domain, domains.Domain):
            continue
        match domain:
            case domains.Uniform(lower=lo, upper=hi):
                out[name] = (lo, hi)
            case domains.QUniform(lower=lo, upper=hi):
                logger.warning("BayesOpt cannot quantize `%s`: q is dropped", name)
                out[name] = (lo, hi)
            case domains.LogUniform(lower=lo, upper=hi) | domains.QLogUniform(lower=lo, upper=hi):
                # as Ray: the bounds stay, the log scale goes (the process is uniform)
                logger.warning(
                    "BayesOpt does not support specific sampling methods: `%s` is searched "
                    "uniformly between its bounds, not on a log scale",
                    name,
                )
                out[name] = (lo, hi)
            case _:
                raise ValueError(
                    f"BayesOpt does not support parameters of type `{type(domain).__name__}` "
                    f"(`{name}`): it searches floats only (uniform, loguniform and their "
                    "q-forms)"
                )
    return out


def _bounds_of(space: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """A ``space`` given to the searcher: popflow's domains (converted, with Ray's
    warning) or ``(lower, upper)`` bounds by name."""
    flat = flat_keys(space)
    if any(isinstance(v, domains.Domain) or is_grid_search(v) for v in flat.values()):
        logger.warning(
            "BayesOptSearch got popflow search spaces as `space`: they are converted, but "
            "pass them as the run's `param_space` instead (Ray's advice)"
        )
        return convert_search_space(space)
    out: dict[str, tuple[float, float]] = {}
    for name, bounds in flat.items():
        if (
            not isinstance(bounds, Sequence)
            or isinstance(bounds, str)
            or len(bounds) != 2
            or not all(is_number(b) for b in bounds)
            or not bounds[0] < bounds[1]
        ):
            raise ValueError(
                f"`space[{name!r}]` is {bounds!r}, but must be (lower, upper) with lower < upper"
            )
        out[name] = (float(bounds[0]), float(bounds[1]))
    return out


def _base_seed(random_state: Any) -> int | None:
    """The seed every suggestion's own derives from."""
    if random_state is None:
        return None
    if isinstance(random_state, np.random.RandomState):
        # one draw from a copy: the user's generator is left as it was
        return int(copy.deepcopy(random_state).randint(0, 2**32, dtype=np.uint64))
    if isinstance(random_state, bool) or not isinstance(random_state, int | np.integer):
        raise TypeError(
            f"`random_state` is {random_state!r}, but must be an int, a "
            "numpy.random.RandomState or None"
        )
    if not 0 <= random_state < 2**32:
        raise ValueError(f"`random_state` is {random_state}, but must be in [0, 2**32)")
    return int(random_state)


def _config_key(config: dict[str, Any], precision: int) -> str:
    """Two configs are one when their floats agree to ``precision`` decimals (Ray's)."""
    rounded = {
        k: f"{v:.{precision}f}" if isinstance(v, float) else v for k, v in flat_keys(config).items()
    }
    return json.dumps(rounded, sort_keys=True, default=str)


def _bayes_opt() -> Any:
    """bayes_opt, imported when first needed (an optional extra)."""
    return require("bayes_opt", "bayesopt", "BayesOptSearch")
