"""``ray.tune.search.hebo``: HEBO (Huawei Noah's Ark's heteroscedastic evolutionary
Bayesian optimisation) as a search algorithm.

    from popflow.tune.search.hebo import HEBOSearch
    tuner = tune.Tuner(train, param_space={"x": tune.uniform(0, 1)},
                       tune_config=tune.TuneConfig(search_alg=HEBOSearch(),
                                                   metric="loss", mode="min", num_samples=20))

Needs the ``hebo`` extra and HEBO itself without its dependencies (HEBO 0.3.6 pins
``numpy<1.25`` and ``pymoo==0.6.0``, stale pins its code does not need):

    pip install 'popflow[hebo]' && pip install --no-deps HEBO==0.3.6

As in Ray: the space as HEBO's parameters (``num``, ``pow``, ``int``, ``pow_int``,
``cat``; nested names ``/``-joined), quantization dropped, ``randn`` and ``sample_from``
refused; ``points_to_evaluate`` first (told to HEBO at once with ``evaluated_rewards``);
suggestions in batches of ``max_concurrent`` (a ``ConcurrencyLimiter``'s limit overrides
it), a new batch once the last one's trials all ended; NaN or infinite results not told.
popflow differs where a resume needs it: HEBO draws from numpy's and torch's global
generators, and (on pymoo 0.6.2) its evolutionary search from fresh entropy; here every
HEBO call draws from generators of this searcher's own, seeded by ``random_state_seed``
or else the run's seed, with pymoo seeded from them. A resumed run's replayed calls so
give back the same suggestions, and the process's global generators are left alone
(Ray seeds them). Importing HEBO sets torch to one thread in the process (HEBO's own
doing, in Ray too).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from popflow.flows.integrations.search_values import has_domains, is_number, metric_of, plain
from popflow.schedulers import domains
from popflow.schedulers.search import Searcher
from popflow.schedulers.search.searcher import DEFAULT_METRIC, check_mode
from popflow.schedulers.search_space import flat_keys, is_grid_search, nested_keys

logger = logging.getLogger(__name__)

__all__ = ["HEBOSearch"]

#: how to install what HEBOSearch needs (HEBO's own pins cannot resolve beside popflow's)
INSTALL = "pip install 'popflow[hebo]' && pip install --no-deps HEBO==0.3.6"
#: HEBO's runtime needs, as the extra names them (import names)
_NEEDS = ("hebo", "disjoint_set", "pymoo", "gpytorch", "sklearn", "torch", "pandas")


class HEBOSearch(Searcher):
    """Ray's ``ray.tune.search.hebo.HEBOSearch``.

    ``space``: popflow search spaces by name, or HEBO's ``DesignSpace``; None to take the
    run's ``param_space``. ``metric``/``mode``: the objective. ``points_to_evaluate``:
    configs tried first; ``evaluated_rewards``: their results, if known (then told to
    HEBO, not run). ``random_state_seed``: the seed of HEBO's draws (None: the run's).
    ``max_concurrent``: the batch HEBO suggests at once. ``kwargs``: ``HEBO()``'s
    (``model_name``, ``rand_sample``, ...).
    """

    def __init__(
        self,
        space: dict[str, Any] | Any = None,
        metric: str | None = None,
        mode: str | None = None,
        points_to_evaluate: list[dict[str, Any]] | None = None,
        evaluated_rewards: list[Any] | None = None,
        random_state_seed: int | None = None,
        max_concurrent: int = 8,
        **kwargs: Any,
    ) -> None:
        hebo_modules()  # the missing library named now, as Ray asserts at once
        check_mode(mode)
        if metric and mode and not isinstance(metric, type(mode)):  # Ray's Searcher asserts it
            raise ValueError("metric and mode must be of the same type")
        if isinstance(mode, list | tuple):
            raise ValueError(f"`mode` is {mode!r}, but must be 'min' or 'max'")
        _check_concurrency(max_concurrent)
        if random_state_seed is not None and (
            isinstance(random_state_seed, bool) or not isinstance(random_state_seed, int)
        ):
            raise ValueError(
                f"`random_state_seed` is {random_state_seed!r}, but must be None or an int"
            )
        super().__init__(metric=metric, mode=mode)
        self._points = _check_points(points_to_evaluate, evaluated_rewards)
        self._rewards = list(evaluated_rewards) if evaluated_rewards else None
        self._space: Any = _own_space(space)
        self._hebo_config = dict(kwargs)
        self._seed = random_state_seed
        self._max_concurrent = max_concurrent
        self._opt: Any = None  # HEBO's optimiser, made on first use (once the seed is known)
        self._rng: tuple[Any, Any] | None = None  # (numpy's, torch's) generator states
        self._live: dict[str, dict[str, Any]] = {}  # trial id -> its flat params
        self._cache: list[dict[str, Any]] = []  # the batch's suggestions not yet given
        self._batch_filled = False

    # -- Ray's protocol -------------------------------------------------------------
    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        """The run's metric, mode and seed where this searcher has none; its
        ``param_space`` as the space unless the searcher has its own (then False)."""
        if self._seed is None and spec.get("seed") is not None:
            self._seed = int(spec["seed"])
        self.take_run_metric(metric, mode)
        if self._space is not None or self._opt is not None:
            return False
        if has_domains(config):
            self._space = convert_search_space(config)
            self._setup()  # HEBO's refusals (an empty space, bad points) before any trial
        return True

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        _check_concurrency(max_concurrent)
        self._max_concurrent = max_concurrent
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        self._setup()
        if not self._live:
            self._batch_filled = False
        if self._points:
            params = self._points.pop(0)
        else:
            if self._batch_filled or len(self._live) >= self._max_concurrent:
                return None  # Ray's batches: the next one once this one's trials ended
            if not self._cache:
                with self._own_random():
                    batch = self._opt.suggest(n_suggestions=self._max_concurrent)
                self._cache = [plain(dict(r)) for r in batch.to_dict("records")]
            params = self._cache.pop(0)
        self._live[trial_id] = params
        if len(self._live) >= self._max_concurrent:
            self._batch_filled = True
        return nested_keys(dict(params))

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        params = self._live.pop(trial_id, None)
        if params is None or not result or error:
            return  # as Ray: HEBO learns nothing from a trial without a result
        value = metric_of(result, self._metric)
        if not is_number(value) or not math.isfinite(float(value)):
            logger.debug("HEBOSearch: %s=%r of %s is not told", self._metric, value, trial_id)
            return
        self._observe([params], [float(value)])

    def add_evaluated_point(
        self,
        parameters: dict[str, Any],
        value: float,
        error: bool = False,
        pruned: bool = False,
        intermediate_values: list[float] | None = None,
    ) -> None:
        if intermediate_values:
            logger.warning("HEBO doesn't use intermediate_values. Ignoring.")
        if error or pruned:
            logger.warning("Only non errored and non pruned points can be added to HEBO.")
            return
        self._setup()
        flat = flat_keys(dict(parameters))
        self._observe([{k: v for k, v in flat.items() if k in self._space.para_names}], [value])

    # -- the optimiser ---------------------------------------------------------------
    def _setup(self) -> None:
        """Ray's ``_setup_optimizer``: HEBO made over the space, its generators seeded,
        the points with rewards told to it."""
        if self._opt is not None:
            return
        hebo, design_space, _ = hebo_modules()
        if self._space is None:
            raise RuntimeError(
                "HEBOSearch has no search space: pass `space`, or a `param_space` with "
                "search spaces to the run"
            )
        if self._metric is None and self._mode:
            self._metric = DEFAULT_METRIC
        if not self._metric or not self._mode:
            raise RuntimeError(
                f"HEBOSearch has metric={self._metric!r} and mode={self._mode!r}: pass both "
                "to it, or to the run"
            )
        if not isinstance(self._space, design_space.DesignSpace) or self._space.num_paras <= 0:
            raise ValueError(
                "Got empty search space. Please make sure to pass a valid search space with "
                "at least one parameter to `HEBOSearch`"
            )
        names = list(self._space.para_names)
        for point in self._points:
            missing = [n for n in names if n not in point]
            if missing:
                raise ValueError(
                    f"a point of `points_to_evaluate` ({nested_keys(point)!r}) has no value "
                    f"for {missing}"
                )
        # numpy's and torch's streams, apart; unseeded (no seed anywhere): fresh entropy
        entropy = self._seed if self._seed is not None else None
        np_seed, torch_seed = np.random.SeedSequence(entropy).generate_state(2)
        torch = hebo_modules()[2]
        self._rng = (
            np.random.RandomState(int(np_seed)).get_state(),
            torch.Generator().manual_seed(int(torch_seed)).get_state(),
        )
        with self._own_random():
            self._opt = hebo.HEBO(space=self._space, **self._hebo_config)
        if self._rewards:
            points, self._points = self._points, []
            self._observe(points, self._rewards)

    def _observe(self, params: list[dict[str, Any]], values: list[Any]) -> None:
        """Results told to HEBO, which minimises: "max" is negated."""
        import pandas as pd

        sign = -1.0 if self._mode == "max" else 1.0
        names = list(self._space.para_names)
        frame = pd.DataFrame([{n: p[n] for n in names} for p in params])
        with self._own_random():
            self._opt.observe(frame, sign * np.array(values, dtype=float).reshape(-1, 1))

    @contextlib.contextmanager
    def _own_random(self) -> Iterator[None]:
        """numpy's and torch's global generators set to this searcher's for a HEBO call
        (and given back after); pymoo, which draws fresh entropy unless seeded, seeded
        from them (as pymoo 0.6.0, which HEBO pins, did)."""
        torch = hebo_modules()[2]
        evolution = _evolution_module()
        outer = (np.random.get_state(), torch.get_rng_state())
        minimize = evolution.minimize

        def seeded_minimize(*args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("seed", int(np.random.randint(0, 2**31 - 1)))
            return minimize(*args, **kwargs)

        assert self._rng is not None
        np.random.set_state(self._rng[0])
        torch.set_rng_state(self._rng[1])
        evolution.minimize = seeded_minimize
        try:
            yield
        finally:
            evolution.minimize = minimize
            self._rng = (np.random.get_state(), torch.get_rng_state())
            np.random.set_state(outer[0])
            torch.set_rng_state(outer[1])


def convert_search_space(spec: dict[str, Any]) -> Any:
    """popflow's (Ray's) search space as HEBO's ``DesignSpace`` (``/``-joined names);
    constants are left to the run's ``param_space``."""
    params = []
    for name, value in flat_keys(spec).items():
        if is_grid_search(value):
            raise ValueError(
                f"`{name}` is a grid_search: grid search parameters cannot be automatically "
                "converted to a HEBO search space"
            )
        if isinstance(value, domains.Domain):
            params.append(_parameter(name, value))
    if not params:
        return None
    return hebo_modules()[1].DesignSpace().parse(params)


def _parameter(name: str, domain: domains.Domain) -> dict[str, Any]:
    """One domain as a HEBO parameter (Ray's mapping: the upper bound Ray excludes made
    inclusive for integers)."""
    quantized = (domains.QUniform, domains.QLogUniform, domains.QRandInt, domains.QLogRandInt)
    if isinstance(domain, quantized):
        logger.warning("HEBO search does not support quantization: q of `%s` is dropped", name)
    match domain:
        case domains.Uniform(lower=lo, upper=hi) | domains.QUniform(lower=lo, upper=hi):
            return {"name": name, "type": "num", "lb": lo, "ub": hi}
        case domains.LogUniform(lower=lo, upper=hi) | domains.QLogUniform(lower=lo, upper=hi):
            return {"name": name, "type": "pow", "lb": lo, "ub": hi}
        case domains.RandInt(lower=lo, upper=hi):
            return {"name": name, "type": "int", "lb": lo, "ub": hi - 1}
        case domains.QRandInt():
            return {"name": name, "type": "int", "lb": domain.first, "ub": domain.last}
        case domains.LogRandInt(lower=lo, upper=hi):
            return {"name": name, "type": "pow_int", "lb": lo, "ub": hi - 1}
        case domains.QLogRandInt():
            return {"name": name, "type": "pow_int", "lb": domain.first, "ub": domain.last}
        case domains.Categorical(categories=categories):
            values = list(categories)
            # HEBO hands a choice back out of a numpy array of the categories: mixed or
            # container values would come back changed (1 as "1"), as they do in Ray
            if len({_kind(v) for v in values}) != 1 or None in {_kind(v) for v in values}:
                raise ValueError(
                    f"HEBOSearch cannot choose among the values of `{name}` ({values!r}): "
                    "HEBO's choices must be all strings, all ints, all floats or all bools"
                )
            return {"name": name, "type": "cat", "categories": values}
        case _:
            raise ValueError(
                f"HEBO does not support parameters of type `{type(domain).__name__}` "
                f"(`{name}`): use uniform, loguniform, randint, lograndint, choice or their "
                "q-forms"
            )


def _kind(value: Any) -> type | None:
    """The kind of a choice HEBO gives back unchanged (None: one it would change)."""
    for kind in (bool, str, int, float):  # bool first: a bool is an int
        if isinstance(value, kind):
            return kind
    return None


def _own_space(space: Any) -> Any:
    """A ``space`` given to the searcher: popflow's domains (converted, with Ray's
    warning) or HEBO's ``DesignSpace``."""
    if space is None or (isinstance(space, Mapping) and not space):
        return None
    if isinstance(space, Mapping):
        if not all(
            isinstance(v, domains.Domain) or is_grid_search(v)
            for v in flat_keys(dict(space)).values()
        ):
            raise TypeError(
                "Space must be either a HEBO DesignSpace object or a dictionary with ONLY "
                f"popflow search spaces; got {dict(space)!r}"
            )
        logger.warning(
            "HEBOSearch got popflow search spaces as `space`: they are converted, but pass "
            "them as the run's `param_space` instead (Ray's advice)"
        )
        return convert_search_space(dict(space))
    if not isinstance(space, hebo_modules()[1].DesignSpace):
        raise TypeError(
            "Space must be either a HEBO DesignSpace object or a dictionary with ONLY "
            f"popflow search spaces. Got {type(space).__name__}."
        )
    return space


def _check_points(points: Any, rewards: Any) -> list[dict[str, Any]]:
    """Ray's ``validate_warmstart``: points as dicts, as many rewards as points."""
    if points is None:
        if rewards:
            raise ValueError("`evaluated_rewards` needs the `points_to_evaluate` they are of")
        return []
    if (
        not isinstance(points, Sequence)
        or isinstance(points, str)
        or not all(isinstance(p, Mapping) for p in points)
    ):
        raise TypeError(f"`points_to_evaluate` is {points!r}, but must be a list of points (dicts)")
    if rewards and (not isinstance(rewards, Sequence) or len(rewards) != len(points)):
        raise ValueError(
            f"Dim of evaluated_rewards {rewards!r} and points_to_evaluate {len(points)} "
            "points do not match"
        )
    return [flat_keys(dict(p)) for p in points]


def _check_concurrency(max_concurrent: Any) -> None:
    if (
        isinstance(max_concurrent, bool)
        or not isinstance(max_concurrent, int)
        or max_concurrent < 1
    ):
        raise ValueError(
            f"`max_concurrent` is {max_concurrent!r}, but must be an integer and at least 1"
        )


def hebo_modules() -> tuple[Any, Any, Any]:
    """(``hebo.optimizers.hebo``, ``hebo.design_space.design_space``, ``torch``),
    imported when first needed; missing, the install lines named."""
    import importlib

    try:
        return (
            importlib.import_module("hebo.optimizers.hebo"),
            importlib.import_module("hebo.design_space.design_space"),
            importlib.import_module("torch"),
        )
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in _NEEDS:
            raise  # something else is missing: say that
        raise ImportError(
            f"HEBOSearch needs HEBO ({e.name} is missing): {INSTALL} (HEBO's own pins, "
            "numpy<1.25 and pymoo==0.6.0, are stale: its code runs on popflow's)"
        ) from None


def _evolution_module() -> Any:
    import importlib

    return importlib.import_module("hebo.acq_optimizers.evolution_optimizer")
