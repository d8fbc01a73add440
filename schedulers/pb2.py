"""Population Based Bandits (PB2; Parker-Holder et al. 2020), with Ray Tune's arguments.

Parker-Holder et al., "Provably Efficient Online Hyperparameter Optimization with
Population-Based Bandits" (NeurIPS 2020), https://arxiv.org/abs/2002.02518.

PB2 is PBT whose explore step is a GP bandit. Exploit is PBT's, unchanged: at
every ``perturbation_interval`` a trial in the bottom ``quantile_fraction``
restarts from a trial of the top ``quantile_fraction``. Its new config is then
*chosen*, not perturbed:

1. Every perturbation point logs a row ``[trial, t, h, r]`` (time, the
   hyperparameters ``h`` the trial trained with, its score ``r``). Consecutive
   rows of one trial with the same ``h`` give an observation: the reward change
   per unit time ``y = Δr / Δt`` at inputs ``x = [t, r_before, h]``.
2. A GP with the time-varying kernel of TV-GP-UCB (Bogunovic et al. 2016,
   https://arxiv.org/abs/1601.06650)
   ``k(x, x') = σ² exp(-‖x̃ - x̃'‖² / λ) (1 - ε)^(|t - t'| / 2)`` (λ: the
   lengthscale; ``x̃``: ``x`` without ``t``) is fitted to the last 1,000
   observations (fewer when a window of ≥ 200 rows has a higher marginal
   likelihood); ``t`` and ``r_before`` are min-max scaled by the data, ``h`` by
   its bounds, ``y`` z-scored and clipped to [-2, 2]; ``σ², λ, ε`` by L-BFGS-B
   on the log marginal likelihood.
3. The new ``h`` maximises ``UCB(h) = μ(t*, r*, h) + √β · v(t*, r*, h)`` with
   ``β = 0.2 + max(0, ln(0.4 N))``, where ``(t*, r*)`` is the source's point and
   ``v`` the variance of a second GP that also holds the configs already chosen
   at this time step (label 0): a batch spreads out (Desautels et al. 2014).

Ray's algorithm, in numpy and scipy instead of pandas and scikit-learn; Ray's
global RNG becomes the injected ``numpy.random.Generator``, so seeded PB2 is
reproducible. Beyond Ray:

- a categorical hyperparameter (a list of three or more values, ``choice()``
  or ``grid_search()`` in ``hyperparam_bounds``) is explored as PBT explores
  one (shift to a neighbour, or resample with probability 0.25); the GP sees
  the continuous ones only. A two-element list is always ``[low, high]``
  (Ray's format): two categories are ``choice([a, b])``;
- a GP fit that fails (non-finite rewards, a singular kernel matrix) falls back
  to PBT's perturbation (``* 1.2`` / ``* 0.8`` / resample, clipped to the
  bounds) for that step, with a warning, instead of crashing the run;
- search-space domains are accepted as bounds: ``uniform(1e-4, 1e-1)`` means
  ``[1e-4, 1e-1]`` and also samples missing initial values.

Example::

    >>> pb2 = PB2(time_attr="training_iteration", metric="mean_accuracy", mode="max",
    ...           perturbation_interval=5,
    ...           hyperparam_bounds={"lr": [1e-4, 1e-1], "opt": {"momentum": [0.8, 0.99]}})
    >>> config = pb2.complete_config({"lr": 0.01})  # missing values: uniform in the bounds
    >>> sorted(config), 0.8 <= config["opt"]["momentum"] <= 0.99
    (['lr', 'opt'], True)
"""

from __future__ import annotations

import copy
import logging
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from popflow.schedulers.domains import (
    Categorical,
    Domain,
    LogRandInt,
    LogUniform,
    QLogRandInt,
    QLogUniform,
    QRandInt,
    QUniform,
    RandInt,
    Uniform,
)
from popflow.schedulers.pb2_gp import (
    GPFitError,
    RewardChanges,
    reward_changes,
    select_config,
)
from popflow.schedulers.pbt import PopulationBasedTraining
from popflow.schedulers.pbt_explore import ExploreFn, explore
from popflow.schedulers.pbt_population import TrialState
from popflow.schedulers.search_space import GRID_SEARCH_KEY, is_grid_search
from popflow.schedulers.trial import Trial
from popflow.schedulers.trial_scheduler import score

__all__ = ["PB2"]

logger = logging.getLogger(__name__)

#: PBT's defaults, for categorical hyperparameters and the fallback explore.
RESAMPLE_PROBABILITY, PERTURBATION_FACTORS = 0.25, (1.2, 0.8)


# -- hyperparam_bounds ------------------------------------------------------------
@dataclass(frozen=True)
class _Param:
    """One flattened entry of ``hyperparam_bounds``: continuous bounds or categories."""

    path: tuple[str, ...]
    low: float = 0.0
    high: float = 0.0
    categories: tuple[Any, ...] | None = None
    #: samples a missing initial value: the user's domain, else uniform in [low, high]
    domain: Domain | None = None

    @property
    def name(self) -> str:
        return "/".join(self.path)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)


_BOUND_RULE = (
    "but must be [low, high] (two finite numbers, low < high), a list of three or "
    "more categories, choice([...]), a bounded search-space domain such as "
    "uniform(low, high), or a dict of nested bounds"
)


def _domain_bounds(name: str, domain: Domain) -> tuple[float, float]:
    if isinstance(domain, Uniform | QUniform | LogUniform | QLogUniform):
        return domain.lower, domain.upper
    if isinstance(domain, QRandInt | QLogRandInt):  # upper excluded with q=1 (Ray 2.60)
        return domain.first, domain.last
    if isinstance(domain, RandInt | LogRandInt):  # upper excluded, as in Ray
        return domain.lower, domain.upper - 1
    raise ValueError(
        f"`hyperparam_bounds['{name}']` is {domain!r}, which has no bounds to read; " + _BOUND_RULE
    )


def _parse_bounds(bounds: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[_Param]:
    params: list[_Param] = []
    for key, spec in bounds.items():
        path = (*prefix, str(key))
        name = "/".join(path)
        if is_grid_search(spec):
            params.append(_Param(path, categories=tuple(spec[GRID_SEARCH_KEY])))
        elif isinstance(spec, Categorical):
            params.append(_Param(path, categories=tuple(spec.categories)))
        elif isinstance(spec, Mapping):
            if not spec:
                raise ValueError(
                    f"`hyperparam_bounds['{name}']` is an empty dict, but nested bounds "
                    "need at least one hyperparameter"
                )
            params.extend(_parse_bounds(spec, path))
        elif isinstance(spec, Domain):
            low, high = _domain_bounds(name, spec)
            params.append(_checked(name, path, spec, low, high, domain=spec))
        elif isinstance(spec, list | tuple) and len(spec) >= 3:
            params.append(_Param(path, categories=tuple(spec)))
        elif isinstance(spec, list | tuple) and len(spec) == 2:
            if not all(_is_number(v) for v in spec):
                raise ValueError(
                    f"`hyperparam_bounds['{name}']` is {spec!r}, but a two-element bound "
                    "must be [low, high] of numbers (for two categories use choice([a, b]))"
                )
            params.append(_checked(name, path, spec, spec[0], spec[1]))
        else:
            raise ValueError(
                f"`hyperparam_bounds['{name}']` is {spec!r} (type {type(spec).__name__}), "
                + _BOUND_RULE
            )
    return params


def _checked(
    name: str, path: tuple[str, ...], spec: Any, low: Any, high: Any, domain: Domain | None = None
) -> _Param:
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(
            f"`hyperparam_bounds['{name}']` is {spec!r}, but its bounds must be finite numbers"
        )
    if not low < high:
        raise ValueError(
            f"`hyperparam_bounds['{name}']` is {spec!r}, but must be [low, high] with "
            f"low < high (here low = {low!r}, high = {high!r})"
        )
    return _Param(path, low=float(low), high=float(high), domain=domain or Uniform(low, high))


def _nest(params: Sequence[_Param], value_of: Any) -> dict[str, Any]:
    """A nested mutation spec ``{path: value_of(param)}`` for ``params``."""
    spec: dict[str, Any] = {}
    for p in params:
        node = spec
        for key in p.path[:-1]:
            node = node.setdefault(key, {})
        node[p.path[-1]] = value_of(p)
    return spec


def _get(config: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        config = config[key]
    return config


def _set(config: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        config = config[key]
    config[path[-1]] = value


def _typed(old: Any, value: float, low: float, high: float) -> Any:
    """``value`` with the old value's type: ints rounded (inside the bounds), floats as float."""
    value = min(max(float(value), low), high)
    if isinstance(old, numbers.Integral):
        lo, hi = math.ceil(low), math.floor(high)
        return min(max(round(value), lo), hi) if lo <= hi else round(value)
    return type(old)(value) if isinstance(old, float) else value


def _encode(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)  # "nan", "inf", "-inf": strict JSON


class PB2(PopulationBasedTraining):
    """Population Based Bandits; see the module docstring and Ray Tune's docs.

    Arguments and defaults are Ray Tune's. ``hyperparam_bounds`` maps each
    hyperparameter to ``[low, high]`` (or a bounded domain such as
    ``uniform(low, high)``, or categories; nested dicts for nested configs);
    missing initial values are sampled uniformly from it. Ints stay ints.
    ``log_config``: the run writes each exploit to ``pbt_global.txt`` and
    ``pbt_policy_<trial_id>.txt``, as for PBT (Ray names them ``pb2_*``).
    """

    def __init__(
        self,
        time_attr: str = "time_total_s",
        metric: str | None = None,
        mode: str | None = None,
        perturbation_interval: float = 60.0,
        hyperparam_bounds: Mapping[str, Any] | None = None,
        quantile_fraction: float = 0.25,
        log_config: bool = True,
        require_attrs: bool = True,
        synch: bool = False,
        custom_explore_fn: ExploreFn | None = None,
        *,
        rng: np.random.Generator | None = None,
    ) -> None:
        if not hyperparam_bounds:
            raise ValueError(
                f"`hyperparam_bounds` is {hyperparam_bounds!r}, but PB2 needs the "
                "[low, high] bounds of at least one hyperparameter"
            )
        if not isinstance(hyperparam_bounds, Mapping):
            raise ValueError(
                f"`hyperparam_bounds` is {hyperparam_bounds!r}, but must be a dict "
                "{name: [low, high]}"
            )
        params = _parse_bounds(hyperparam_bounds)
        continuous = [p for p in params if p.categories is None]
        categorical = [p for p in params if p.categories is not None]
        # PBT's mutations: what complete_config samples from, and the fallback explore.
        mutations = _nest(params, lambda p: p.domain or list(p.categories or ()))
        super().__init__(
            time_attr=time_attr,
            metric=metric,
            mode=mode,
            perturbation_interval=perturbation_interval,
            hyperparam_mutations=mutations,
            quantile_fraction=quantile_fraction,
            resample_probability=RESAMPLE_PROBABILITY,
            perturbation_factors=PERTURBATION_FACTORS,
            custom_explore_fn=custom_explore_fn,
            log_config=log_config,
            require_attrs=require_attrs,
            synch=synch,
            rng=rng,
        )
        self._params = params
        self._continuous = continuous
        self._continuous_mutations = _nest(continuous, lambda p: p.domain)
        self._categorical_mutations = _nest(categorical, lambda p: list(p.categories))
        self._gp_columns = [i for i, p in enumerate(params) if p.categories is None]
        self._lows = np.array([p.low for p in continuous])
        self._highs = np.array([p.high for p in continuous])
        # GP data: one row [t, h..., r] per perturbation point and exploit (Ray's `data`).
        self._row_trials: list[str] = []
        self._rows: list[list[float]] = []
        # Hyperparameters chosen at the latest time step (Ray's `current`).
        self._current: list[list[float]] = []
        self._last_exploration_time = 0.0

    # -- hooks -----------------------------------------------------------------
    def on_trial_add(self, trial: Trial) -> None:
        super().on_trial_add(trial)
        for p in self._continuous:
            value = _get(trial.config, p.path)
            if not _is_number(value):
                raise ValueError(
                    f"trial {trial.trial_id} config has `{p.name}` = {value!r}, but PB2 "
                    f"needs a number inside its bounds [{p.low}, {p.high}]"
                )

    def _row_values(self, config: Mapping[str, Any]) -> list[float]:
        """The ``h`` of a data row: continuous values, categorical ones by index (-1: none)."""
        values = []
        for p in self._params:
            value = _get(config, p.path)
            if p.categories is None:
                values.append(float(value))
            else:
                values.append(float(p.categories.index(value)) if value in p.categories else -1.0)
        return values

    def _save_trial_state(
        self, state: TrialState, time: float, result: dict[str, Any], trial: Trial
    ) -> None:
        super()._save_trial_state(state, time, result, trial)
        reward = score(result, self._metric, self._mode)
        self._row_trials.append(trial.trial_id)
        self._rows.append([float(time), *self._row_values(trial.config), reward])

    def _get_new_config(
        self, trial_id: str, source_id: str
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """GP-UCB for the continuous hyperparameters, PBT's explore for categorical ones."""
        source_config = self._states[source_id].config
        new_config = copy.deepcopy(source_config)
        operations: dict[str, str] = {}
        latest = max(row[0] for row in self._rows)
        if latest > self._last_exploration_time:  # a new time step: no pending batch
            self._last_exploration_time = latest
            self._current = []
        entry = None
        if self._continuous:
            changes = reward_changes(self._row_trials, np.array(self._rows), self._gp_columns)
            mine = [i for i, tid in enumerate(changes.trial_ids) if tid == source_id]
            if not mine:  # no observation of the source yet: keep its values (Ray)
                keep = "keep (no GP data yet)"
                operations.update(dict.fromkeys((p.name for p in self._continuous), keep))
            else:
                last = mine[-1]
                chosen = self._choose(changes, last, trial_id, source_config)
                for p, (value, op) in zip(self._continuous, chosen, strict=True):
                    _set(new_config, p.path, value)
                    operations[p.name] = op
                entry = (float(changes.x[last, 0]), float(changes.reward[last]))
        if self._categorical_mutations:
            new_config, cat_ops = explore(
                new_config,
                self._categorical_mutations,
                RESAMPLE_PROBABILITY,
                PERTURBATION_FACTORS,
                None,
                self._rng,
            )
            operations.update(cat_ops)
        if entry is not None:  # the target restarts from the source's (t, r) with the new h
            self._row_trials.append(trial_id)
            self._rows.append([entry[0], *self._row_values(new_config), entry[1]])
        self._current.append([float(_get(new_config, p.path)) for p in self._continuous])
        if self._custom_explore_fn is not None:  # PBT's call and check of the result
            new_config, _ = explore(new_config, {}, 0.0, (1.0,), self._custom_explore_fn, self._rng)
        return new_config, operations

    def _choose(
        self,
        changes: RewardChanges,
        last: int,
        trial_id: str,
        source_config: Mapping[str, Any],
    ) -> list[tuple[Any, str]]:
        """(value, operation) per continuous hyperparameter: GP-UCB, or PBT on a failed fit."""
        newpoint = changes.x[last, :2]
        current = np.array(self._current).reshape(len(self._current), len(self._continuous))
        try:
            with np.errstate(all="ignore"):
                values = select_config(
                    changes.x, changes.y, current, newpoint, self._lows, self._highs, self._rng
                )
            ops = ["gp-ucb"] * len(values)
        except (GPFitError, np.linalg.LinAlgError, ValueError) as exc:
            logger.warning(
                "PB2 could not fit its GP for trial %s (%s: %s); exploring with PBT's "
                "perturbations instead",
                trial_id,
                type(exc).__name__,
                exc,
            )
            perturbed, pbt_ops = explore(
                source_config,
                self._continuous_mutations,
                RESAMPLE_PROBABILITY,
                PERTURBATION_FACTORS,
                None,
                self._rng,
            )
            values = [float(_get(perturbed, p.path)) for p in self._continuous]
            ops = [f"{pbt_ops[p.name]} (GP fallback)" for p in self._continuous]
        return [
            (_typed(_get(source_config, p.path), v, p.low, p.high), op)
            for p, v, op in zip(self._continuous, values, ops, strict=True)
        ]

    # -- persistence -------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        state["pb2"] = {
            "row_trials": list(self._row_trials),
            "rows": [[_encode(v) for v in row] for row in self._rows],
            "current": [list(row) for row in self._current],
            "last_exploration_time": self._last_exploration_time,
        }
        return state

    def set_state(self, state: Mapping[str, Any]) -> None:
        super().set_state(state)
        pb2 = state["pb2"]
        self._row_trials = list(pb2["row_trials"])
        self._rows = [[float(v) for v in row] for row in pb2["rows"]]
        self._current = [[float(v) for v in row] for row in pb2["current"]]
        self._last_exploration_time = float(pb2["last_exploration_time"])
