"""BOHB's model (Falkner et al., ICML 2018), in numpy/scipy: what Ray's ``TuneBOHB``
suggests from (:mod:`popflow.schedulers.search.bohb`).

Falkner, Klein, Hutter, "BOHB: Robust and Efficient Hyperparameter Optimization at
Scale", https://arxiv.org/abs/1807.01774. Ray's ``TuneBOHB`` drives hpbandster's
``BOHB`` config generator over a ConfigSpace space; neither library is maintained, so
this module is that generator, written again:

- each parameter is a coordinate in ``[0, 1]`` (log-scaled for the log domains, the
  normal CDF for ``randn``, the middle of its cell for an integer) or, for ``choice``,
  a category index;
- each result ``(config, loss)`` is kept per *budget*; once a budget holds
  ``min_points_in_model`` (default: dimensions + 1) results, its best
  ``max(min_points_in_model, top_n_percent% of N)`` make the "good" KDE ``l(x)``, the
  next ``max(min_points_in_model, (100 - top_n_percent)% of N)`` the "bad" one
  ``g(x)``, each with more points than dimensions (hpbandster's rule); bandwidths are
  statsmodels' ``normal_reference`` (``1.06 * std * n**(-1/(d+4))``) clipped below at
  ``min_bandwidth``; results on a budget below the largest one with a model are not
  kept (hpbandster's rule);
- a suggestion is random (the prior) while no model exists and otherwise with
  probability ``random_fraction``; else ``num_samples`` candidates are drawn around
  points of the good KDE of the largest budget with a model (a normal truncated to
  ``[0, 1]``, bandwidth times ``bandwidth_factor``; a category kept with probability
  ``1 - bandwidth``), and the one with the largest ``l(x) / g(x)`` is suggested.

Differences from hpbandster, deliberate:
    - one ``numpy.random.Generator``, seeded from ``seed`` or else the run's seed, is
      the only randomness (hpbandster draws from numpy's global state, which Ray never
      seeds); a ``suggest`` that returns None draws nothing, so a resumed run, which
      replays the committed calls (:mod:`popflow.flows.driver.suggestions`), continues
      as an uninterrupted one;
    - the categorical kernel divides by the parameter's number of categories (statsmodels:
      the number seen in the data) and its bandwidth is at most ``(c - 1) / c``;
    - the *budget* of a result is its ``hyperband_info["budget"]`` where a scheduler put
      one there (Ray's ``HyperBandForBOHB`` does, before the searcher sees the result);
      popflow's driver tells the searcher first, so otherwise it is the result's
      ``time_attr`` (``training_iteration``): every result is an observation at its own
      budget, not only those at a HyperBand milestone;
    - results without the metric are not told to the model (Ray raises a KeyError);
      NaN and infinities are a loss of +inf, as hpbandster's.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special, stats

from popflow.schedulers import domains
from popflow.schedulers.search_space import flat_keys, is_grid_search, nested_keys

logger = logging.getLogger(__name__)

__all__ = ["BOHB_DEFAULTS", "BOHBModel", "convert_search_space"]

#: hpbandster's ``BOHB`` defaults (``min_points_in_model=None``: dimensions + 1)
BOHB_DEFAULTS: dict[str, Any] = {
    "min_points_in_model": None,
    "top_n_percent": 15,
    "num_samples": 64,
    "random_fraction": 1 / 3,
    "bandwidth_factor": 3,
    "min_bandwidth": 1e-3,
}

#: BOHB's ``num_samples`` at most (hpbandster's default: 64): each suggestion draws that
#: many candidates, one Python loop over the dimensions each (10,000: about 1 s a dimension)
MAX_NUM_SAMPLES = 10_000

_EDGE = 1e-12  # keeps the normal CDF's coordinate off 0 and 1


# -- one parameter as a coordinate --------------------------------------------------------
@dataclass(frozen=True)
class _Param:
    """How one domain maps to a coordinate: ``levels`` > 0 for a category index (the
    number of categories), 0 for a number in ``[0, 1]``."""

    name: str
    domain: domains.Domain
    levels: int = 0

    def sample(self, rng: np.random.Generator) -> float:
        """A coordinate from the prior (what the domain itself samples)."""
        if self.levels:
            return float(rng.integers(self.levels))
        return float(rng.uniform(0.0, 1.0))

    def value(self, x: float) -> Any:
        d = self.domain
        if self.levels:
            return copy.deepcopy(d.categories[int(x)])  # type: ignore[attr-defined]
        x = min(max(float(x), 0.0), 1.0)
        match d:
            case domains.Uniform(lower=lo, upper=hi):
                return min(max(lo + x * (hi - lo), lo), hi)
            case domains.LogUniform(lower=lo, upper=hi):
                return min(max(math.exp(_lerp(math.log(lo), math.log(hi), x)), lo), hi)
            case domains.QUniform(q=q) | domains.QLogUniform(q=q):
                k_lo, k_hi = _float_ks(d)
                if isinstance(d, domains.QUniform):
                    v = _lerp(k_lo * q, k_hi * q, x)
                else:
                    v = math.exp(_lerp(math.log(k_lo * q), math.log(k_hi * q), x))
                return min(max(round(v / q), k_lo), k_hi) * q
            case domains.Normal(mean=mean, sd=sd):
                return float(mean + sd * special.ndtri(min(max(x, _EDGE), 1 - _EDGE)))
            case domains.QNormal(mean=mean, sd=sd, q=q):
                v = float(mean + sd * special.ndtri(min(max(x, _EDGE), 1 - _EDGE)))
                return float(round(v / q) * q)
            case domains.RandInt(lower=lo, upper=hi):
                return lo + _cell(x, hi - lo)
            case domains.QRandInt(q=q):
                k_lo, k_hi = _int_ks(d)
                return (k_lo + _cell(x, k_hi - k_lo + 1)) * q
            case domains.LogRandInt(lower=lo, upper=hi):
                v = math.floor(math.exp(_lerp(math.log(lo), math.log(hi), x)))
                return min(max(v, lo), hi - 1)
            case domains.QLogRandInt(q=q):
                k_lo, k_hi = _int_ks(d)
                k = math.floor(math.exp(_lerp(math.log(k_lo), math.log(k_hi + 1), x)))
                return min(max(k, k_lo), k_hi) * q
        raise AssertionError(d)

    def coordinate(self, value: Any) -> float:
        """The coordinate of ``value`` (a point to evaluate); ValueError if outside."""
        d = self.domain
        if self.levels:
            for i, category in enumerate(d.categories):  # type: ignore[attr-defined]
                if category == value:
                    return float(i)
            raise ValueError(f"`{self.name}` is {value!r}, which is not one of its categories")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"`{self.name}` is {value!r}, but must be a number")
        v = float(value)
        match d:
            case domains.Uniform(lower=lo, upper=hi):
                x = (v - lo) / (hi - lo)
            case domains.LogUniform(lower=lo, upper=hi):
                x = _unlerp(math.log(lo), math.log(hi), math.log(max(v, lo)))
            case domains.QUniform(q=q):
                k_lo, k_hi = _float_ks(d)
                x = _unlerp(k_lo * q, k_hi * q, v)
            case domains.QLogUniform(q=q):
                k_lo, k_hi = _float_ks(d)
                x = _unlerp(math.log(k_lo * q), math.log(k_hi * q), math.log(max(v, k_lo * q)))
            case domains.Normal(mean=mean, sd=sd) | domains.QNormal(mean=mean, sd=sd):
                x = float(special.ndtr((v - mean) / sd))
            case domains.RandInt(lower=lo, upper=hi):
                x = (round(v) - lo + 0.5) / (hi - lo)
            case domains.QRandInt(q=q):
                k_lo, k_hi = _int_ks(d)
                x = (round(v / q) - k_lo + 0.5) / (k_hi - k_lo + 1)
            case domains.LogRandInt(lower=lo, upper=hi):
                mid = (math.log(max(v, lo)) + math.log(max(v, lo) + 1)) / 2
                x = _unlerp(math.log(lo), math.log(hi), mid)
            case domains.QLogRandInt(q=q):
                k_lo, k_hi = _int_ks(d)
                k = max(round(v / q), k_lo)
                mid = (math.log(k) + math.log(k + 1)) / 2
                x = _unlerp(math.log(k_lo), math.log(k_hi + 1), mid)
            case _:
                raise AssertionError(d)
        return min(max(x, 0.0), 1.0)


def _lerp(a: float, b: float, x: float) -> float:
    return a + x * (b - a)


def _unlerp(a: float, b: float, v: float) -> float:
    return 0.5 if b == a else (v - a) / (b - a)


def _cell(x: float, count: int) -> int:
    """The integer cell ``0 .. count-1`` of ``[0, 1]`` split in ``count`` equal cells."""
    return min(int(x * count), count - 1)


def _float_ks(d: Any) -> tuple[int, int]:
    return d._k_range  # the multiples of q inside the bounds, as the domain samples them


def _int_ks(d: Any) -> tuple[int, int]:
    return d._k_range  # the multiples it samples (upper excluded with q=1, as Ray 2.60)


_NUMERIC = (
    domains.Uniform,
    domains.QUniform,
    domains.LogUniform,
    domains.QLogUniform,
    domains.Normal,
    domains.QNormal,
    domains.RandInt,
    domains.QRandInt,
    domains.LogRandInt,
    domains.QLogRandInt,
)


def convert_search_space(spec: Mapping[str, Any]) -> dict[str, domains.Domain]:
    """Ray's ``TuneBOHB.convert_search_space``: the search spaces of a ``param_space`` by
    ``/``-joined name (constants are left to the run's ``param_space``). A grid_search or a
    ``sample_from`` cannot be modelled: ValueError naming it."""
    out: dict[str, domains.Domain] = {}
    for name, value in flat_keys(dict(spec)).items():
        if is_grid_search(value):
            raise ValueError(
                f"`{name}` is a grid_search: grid search parameters cannot be automatically "
                "converted to a TuneBOHB search space; use choice([...]) instead"
            )
        if not isinstance(value, domains.Domain):
            continue
        if isinstance(value, (domains.Categorical, *_NUMERIC)):
            out[name] = value
        else:
            raise ValueError(
                f"TuneBOHB does not support parameters of type `{type(value).__name__}` "
                f"(`{name}`): it models uniform, loguniform, randn, randint, lograndint, their "
                "q-forms and choice"
            )
    return out


def _params(space: Mapping[str, domains.Domain]) -> list[_Param]:
    return [
        _Param(name, d, len(d.categories) if isinstance(d, domains.Categorical) else 0)
        for name, d in space.items()
    ]


# -- the KDEs -----------------------------------------------------------------------------
class _KDE:
    """statsmodels' ``KDEMultivariate`` as hpbandster uses it: a Gaussian kernel on each
    number, Aitchison-Aitken's on each category index, ``normal_reference`` bandwidths."""

    def __init__(self, data: np.ndarray, levels: np.ndarray, min_bandwidth: float) -> None:
        self.data = data
        self.levels = levels
        n, d = data.shape
        bw = 1.06 * np.std(data, axis=0) * n ** (-1.0 / (4 + d))
        bw = np.maximum(bw, min_bandwidth)
        cat = levels > 0
        top = np.where(cat, (np.maximum(levels, 1) - 1) / np.maximum(levels, 1), np.inf)
        self.bw = np.where(cat, np.minimum(bw, np.maximum(top, min_bandwidth)), bw)

    def pdf(self, x: np.ndarray) -> np.ndarray:
        """Densities at the rows of ``x`` (shape ``(m, d)``)."""
        diff = x[:, None, :] - self.data[None, :, :]  # (m, n, d)
        cat = self.levels > 0
        h = self.bw
        gauss = np.exp(-0.5 * (diff / h) ** 2) / (math.sqrt(2 * math.pi) * h)
        others = np.where(self.levels > 1, h / np.maximum(self.levels - 1, 1), 0.0)
        aitchison = np.where(np.abs(diff) < 0.5, 1.0 - h, others)
        kernel = np.where(cat, aitchison, gauss)
        return np.prod(kernel, axis=2).mean(axis=1)


class BOHBModel:
    """hpbandster's BOHB config generator over ``space`` (popflow domains by name).

    ``new_result(vector, loss, budget)`` tells it one result (a loss: smaller is better);
    ``get_vector(rng)`` draws the next configuration's coordinates; ``config(vector)``
    turns them into values by name.
    """

    def __init__(self, space: Mapping[str, domains.Domain], **bohb_config: Any) -> None:
        unknown = sorted(set(bohb_config) - set(BOHB_DEFAULTS))
        if unknown:
            raise TypeError(
                f"`bohb_config` has {unknown}, which BOHB does not take: it takes "
                f"{sorted(BOHB_DEFAULTS)}"
            )
        cfg = {**BOHB_DEFAULTS, **bohb_config}
        if not space:
            raise ValueError("TuneBOHB's search space is empty: give it parameters to search")
        self.params = _params(space)
        self.levels = np.array([p.levels for p in self.params], dtype=float)
        dims = len(self.params)
        mpim = cfg["min_points_in_model"]
        if mpim is None:
            mpim = dims + 1
        elif isinstance(mpim, bool) or not isinstance(mpim, int):
            raise TypeError(f"`min_points_in_model` is {mpim!r}, but must be an int or None")
        elif mpim < dims + 1:
            logger.warning(
                "BOHB: min_points_in_model (%d) must be at least the dimensions + 1; set to %d",
                mpim,
                dims + 1,
            )
            mpim = dims + 1
        self.min_points_in_model = mpim
        self.top_n_percent = _number("top_n_percent", cfg["top_n_percent"], 0, 100)
        # candidates drawn per suggestion, each a row in memory and a loop of KDE draws
        self.num_samples = int(_number("num_samples", cfg["num_samples"], 1, MAX_NUM_SAMPLES))
        self.random_fraction = _number("random_fraction", cfg["random_fraction"], 0, 1)
        self.bw_factor = _number("bandwidth_factor", cfg["bandwidth_factor"], 0, math.inf)
        self.min_bandwidth = _number("min_bandwidth", cfg["min_bandwidth"], 0, math.inf)
        self.configs: dict[float, list[np.ndarray]] = {}
        self.losses: dict[float, list[float]] = {}
        self.kde_models: dict[float, tuple[_KDE, _KDE]] = {}

    # -- learning -------------------------------------------------------------------------
    def new_result(self, vector: np.ndarray, loss: float, budget: float) -> None:
        loss = float(loss) if math.isfinite(loss) else math.inf
        self.configs.setdefault(budget, [])
        self.losses.setdefault(budget, [])
        if max(self.kde_models, default=-math.inf) > budget:
            return  # a model on a larger budget exists: smaller ones are not kept
        self.configs[budget].append(np.asarray(vector, dtype=float))
        self.losses[budget].append(loss)
        n = len(self.configs[budget])
        if n <= self.min_points_in_model - 1:
            return
        data, losses = np.array(self.configs[budget]), np.array(self.losses[budget])
        n_good = max(self.min_points_in_model, int(self.top_n_percent * n) // 100)
        n_bad = max(self.min_points_in_model, int((100 - self.top_n_percent) * n) // 100)
        order = np.argsort(losses, kind="stable")
        good, bad = data[order[:n_good]], data[order[n_good : n_good + n_bad]]
        dims = data.shape[1]
        if good.shape[0] <= dims or bad.shape[0] <= dims:
            return
        self.kde_models[budget] = (
            _KDE(good, self.levels, self.min_bandwidth),
            _KDE(bad, self.levels, self.min_bandwidth),
        )

    @property
    def model_budget(self) -> float | None:
        """The budget whose KDEs suggest (the largest with a model), or None."""
        return max(self.kde_models, default=None)

    # -- suggesting -----------------------------------------------------------------------
    def random_vector(self, rng: np.random.Generator) -> np.ndarray:
        return np.array([p.sample(rng) for p in self.params])

    def get_vector(self, rng: np.random.Generator) -> np.ndarray:
        """hpbandster's ``get_config``: the prior while no model exists and with
        probability ``random_fraction``, else the best of ``num_samples`` candidates
        drawn around the good KDE's points by ``g(x) / l(x)`` (smallest first)."""
        if not self.kde_models or rng.random() < self.random_fraction:
            return self.random_vector(rng)
        good, bad = self.kde_models[max(self.kde_models)]
        candidates = np.empty((self.num_samples, len(self.params)))
        for i in range(self.num_samples):
            datum = good.data[int(rng.integers(len(good.data)))]
            for j, (m, bw, levels) in enumerate(zip(datum, good.bw, self.levels, strict=True)):
                bw = max(bw, self.min_bandwidth)
                if levels == 0:
                    bw *= self.bw_factor
                    candidates[i, j] = stats.truncnorm.rvs(
                        -m / bw, (1 - m) / bw, loc=m, scale=bw, random_state=rng
                    )
                elif rng.random() < 1 - bw:
                    candidates[i, j] = m
                else:
                    candidates[i, j] = float(rng.integers(int(levels)))
        ratio = np.maximum(bad.pdf(candidates), 1e-32) / np.maximum(good.pdf(candidates), 1e-32)
        return candidates[int(np.argmin(ratio))]

    def config(self, vector: np.ndarray) -> dict[str, Any]:
        return {p.name: p.value(x) for p, x in zip(self.params, vector, strict=True)}

    def vector(self, config: Mapping[str, Any]) -> np.ndarray:
        """The coordinates of a config (flat names); ValueError naming what is missing."""
        missing = [p.name for p in self.params if p.name not in config]
        if missing:
            raise ValueError(f"the point {nested_keys(dict(config))!r} has no value for {missing}")
        return np.array([p.coordinate(config[p.name]) for p in self.params])


def _number(name: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ValueError(f"`{name}` is {value!r}, but must be a number in [{low}, {high}]")
    return float(value)
