"""Ray's ``NevergradSearch`` over the real Nevergrad: each trial's config from a Nevergrad
optimizer's ``ask``, each trial's end ``tell``-ed as a loss.

    import nevergrad as ng
    from popflow.tune.search.nevergrad import NevergradSearch
    tuner = tune.Tuner(train, param_space={"lr": tune.loguniform(1e-4, 1e-1)},
                       tune_config=tune.TuneConfig(
                           search_alg=NevergradSearch(optimizer=ng.optimizers.OnePlusOne),
                           metric="loss", mode="min", num_samples=20))

Needs the ``nevergrad`` extra (``pip install 'popflow[nevergrad]'``). Nevergrad
minimises, so a ``"max"`` metric is told negated. Its optimizers draw every random
number from their parametrization's ``random_state``: unless the user seeded it, that is
a ``numpy.random.RandomState`` seeded with the run's seed, so a seeded run suggests the
same configs every time, and after a resume (:mod:`popflow.flows.driver.suggestions`).
The optimizer is made when the searcher first needs it, once the run has told it its
metric, mode and seed.
"""

from __future__ import annotations

import copy
import inspect
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from popflow.flows.integrations.search_values import is_number, metric_of, plain
from popflow.infra.optional_imports import require
from popflow.schedulers import domains
from popflow.schedulers.search import Searcher
from popflow.schedulers.search_space import flat_keys, is_grid_search, nested_keys
from popflow.tasks.result_keys import DEFAULT_METRIC

logger = logging.getLogger(__name__)


class NevergradSearch(Searcher):
    """Ray's ``ray.tune.search.nevergrad.NevergradSearch``.

    ``optimizer``: a Nevergrad optimizer class (``ng.optimizers.OnePlusOne``, a
    ``ConfiguredOptimizer``), made with ``optimizer_kwargs`` on the space; or an optimizer
    already made, with ``space`` None (its parametrization names the parameters) or the
    list of its parameters' names. ``space``: an ``ng.p.Dict`` or a keyword-only
    ``ng.p.Instrumentation`` (``"a/b"`` names nested keys), a dict of Nevergrad
    parameters, or None to take the run's ``param_space``. ``metric``/``mode``: Ray's.
    ``points_to_evaluate``: configs tried first, in order.
    """

    def __init__(
        self,
        optimizer: Any = None,
        optimizer_kwargs: dict[str, Any] | None = None,
        space: Any = None,
        metric: str | None = None,
        mode: str | None = None,
        points_to_evaluate: list[dict[str, Any]] | None = None,
    ) -> None:
        ng = _nevergrad()
        super().__init__(metric=metric, mode=mode)
        base = ng.optimization.base
        if points_to_evaluate is not None and (
            not isinstance(points_to_evaluate, Sequence) or isinstance(points_to_evaluate, str)
        ):
            raise ValueError(
                f"`points_to_evaluate` is {type(points_to_evaluate).__name__}, but must be a "
                "list of points (dicts)"
            )
        if isinstance(space, Mapping) and space:
            space = _space_from_dict(dict(space))
        elif isinstance(space, Mapping):
            space = None
        self._names: list[str] | None = None
        self._optimizer: Any = None  # the optimizer given made, else made on first use
        self._factory: Any = None
        if isinstance(optimizer, base.Optimizer):
            if space is not None and not _is_names(space):
                raise ValueError(
                    "NevergradSearch got an optimizer already made: pass `space` as None or "
                    "the list of its parameters' names, not a parametrization"
                )
            if optimizer_kwargs:
                raise ValueError(
                    "NevergradSearch got `optimizer_kwargs` with an optimizer already made: "
                    "pass an optimizer class or a ConfiguredOptimizer to take them"
                )
            self._names = list(space) if space is not None else None
            self._optimizer = optimizer
        elif (inspect.isclass(optimizer) and issubclass(optimizer, base.Optimizer)) or isinstance(
            optimizer, base.ConfiguredOptimizer
        ):
            if space is not None and not isinstance(space, ng.p.Parameter):
                raise TypeError(
                    f"`space` is {space!r}, but must be a Nevergrad parametrization "
                    "(ng.p.Dict, ng.p.Instrumentation), a dict of search spaces or None"
                )
            self._factory = optimizer
        else:
            raise ValueError(
                f"`optimizer` is {optimizer!r}, but NevergradSearch needs a Nevergrad optimizer "
                "class (e.g. ng.optimizers.OnePlusOne), a ConfiguredOptimizer or an optimizer "
                "instance"
            )
        self._space: Any = None if self._optimizer is not None else space
        self._optimizer_kwargs = dict(optimizer_kwargs or {})
        self._points = [dict(p) for p in points_to_evaluate or []]
        self._seed: int | None = None
        self._live: dict[str, Any] = {}
        self._ready = False  # the optimizer is made, seeded and given the points
        self._points_asked = 0  # Nevergrad asks the points first, in order

    # -- Ray's protocol -------------------------------------------------------------
    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        """The run's metric, mode and seed where this searcher has none; its
        ``param_space`` as the space unless the searcher has its own (then False)."""
        self.take_run_metric(metric, mode)
        if self._seed is None and spec.get("seed") is not None:
            self._seed = int(spec["seed"])
        if self._optimizer is not None or self._space is not None:
            return False
        self._space = convert_search_space(config)
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        optimizer = self.nevergrad_optimizer
        candidate = optimizer.ask()
        self._live[trial_id] = candidate
        if self._points_asked < len(self._points):
            # the point as given: Nevergrad's own copy went through its transforms
            # (a log-scaled 0.01 comes back 0.010000000000000004)
            point = flat_keys(self._points[self._points_asked])
            self._points_asked += 1
            values = {name: point[name] for name in self._point_names()}
        elif candidate.kwargs:
            values = dict(candidate.kwargs)
        elif self._names is not None:
            values = dict(zip(self._names, np.ravel(candidate.args[0]), strict=True))
        else:
            values = dict(candidate.value)
        return nested_keys({k: plain(v) for k, v in values.items()})

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        candidate = self._live.pop(trial_id, None)
        # Ray tells nothing of a trial that failed (its result is None there)
        if candidate is None or error or not result:
            return
        value = metric_of(result, self.metric)
        if not is_number(value):
            logger.warning(
                "NevergradSearch: trial %s ended without a number for `%s` (%r): not told",
                trial_id,
                self.metric,
                value,
            )
            return
        loss = -float(value) if self.mode == "max" else float(value)  # Nevergrad minimises
        try:
            self.nevergrad_optimizer.tell(candidate, loss)
        except _nevergrad().errors.TellNotAskedNotSupportedError:
            # a point of points_to_evaluate, which this optimizer cannot learn from
            logger.warning(
                "%s cannot be told of a point it did not ask for: trial %s's result is dropped",
                type(self.nevergrad_optimizer).__name__,
                trial_id,
            )

    # -- the optimizer --------------------------------------------------------------
    @property
    def nevergrad_optimizer(self) -> Any:
        """The Nevergrad optimizer, made (or, given made, seeded) on first use: once the
        run told its metric, mode and seed."""
        if not self._ready:
            self._check_metric()
            if self._optimizer is None:
                if self._space is None:
                    raise RuntimeError(
                        "NevergradSearch has no search space: pass `space`, or a `param_space` "
                        "with search spaces to the run"
                    )
                # a copy: the user's parametrization stays as given (and unseeded)
                space = copy.deepcopy(self._space)
                # seeded before the optimizer is made: some draw from it as they are made
                self._seed_parametrization(space)
                self._optimizer = self._factory(space, **self._optimizer_kwargs)
            else:
                self._seed_parametrization(self._optimizer.parametrization)
            self._check_optimizer(self._optimizer)
            self._suggest_points(self._optimizer)
            self._ready = True
        return self._optimizer

    def _check_metric(self) -> None:
        if self._metric is None and self._mode:
            self._metric = DEFAULT_METRIC
        if not self._metric or not self._mode:
            raise RuntimeError(
                f"NevergradSearch has metric={self._metric!r} and mode={self._mode!r}: pass "
                "both to it, or to the run"
            )

    def _check_optimizer(self, optimizer: Any) -> None:
        ng = _nevergrad()
        param = optimizer.parametrization
        if self._names is not None:
            if isinstance(param, ng.p.Instrumentation | ng.p.Dict):
                raise ValueError(
                    "NevergradSearch got parameter names in `space`, but the optimizer's "
                    "parametrization names its own: pass `space=None`"
                )
            if optimizer.dimension != len(self._names):
                raise ValueError(
                    f"NevergradSearch got {len(self._names)} parameter names, but the "
                    f"optimizer has {optimizer.dimension} dimensions: one name each"
                )
        elif isinstance(param, ng.p.Instrumentation):
            if param.args:
                raise ValueError(
                    "an ng.p.Instrumentation for NevergradSearch takes keyword parameters only "
                    "(their names are the config's keys)"
                )
        elif not isinstance(param, ng.p.Dict):
            raise ValueError(
                f"the optimizer's parametrization is {type(param).__name__}: NevergradSearch "
                "needs an ng.p.Dict or ng.p.Instrumentation, or the list of parameter names "
                "as `space`"
            )

    def _seed_parametrization(self, param: Any) -> None:
        # a parametrization the user seeded (or drew from) keeps its random state
        if self._seed is not None and getattr(param, "_random_state", None) is None:
            param.random_state = np.random.RandomState(self._seed)

    def _point_names(self) -> list[str]:
        """The names a point of ``points_to_evaluate`` gives values for."""
        param = self._optimizer.parametrization
        if self._names is not None:
            return list(self._names)
        if isinstance(param, _nevergrad().p.Instrumentation):
            return list(param.kwargs)
        return list(param.value)

    def _suggest_points(self, optimizer: Any) -> None:
        ng = _nevergrad()
        param = optimizer.parametrization
        # Nevergrad asks its suggestions last in, first out: the last point goes in first
        names = self._point_names()
        for point in reversed(self._points):
            flat = flat_keys(point)
            missing = [n for n in names if n not in flat]
            if missing:
                raise ValueError(
                    f"a point of `points_to_evaluate` ({point!r}) has no value for {missing}"
                )
            # the space's parameters only: constants of the point are the run's business
            if self._names is not None:
                optimizer.suggest(np.array([flat[n] for n in names], dtype=float))
            elif isinstance(param, ng.p.Instrumentation):
                optimizer.suggest(**{n: flat[n] for n in names})
            else:
                optimizer.suggest({n: flat[n] for n in names})


def convert_search_space(space: dict[str, Any]) -> Any:
    """popflow's (Ray's) search space as an ``ng.p.Dict`` by ``/``-joined name (None when
    it has none); constants are left to the run's ``param_space``."""
    ng = _nevergrad()
    out = _parameters(ng, flat_keys(space))
    return ng.p.Dict(**out) if out else None


def _parameters(ng: Any, flat: dict[str, Any]) -> dict[str, Any]:
    """The search spaces of a flat space as Nevergrad parameters (those that are already
    kept); constants are left out."""
    out: dict[str, Any] = {}
    for name, value in flat.items():
        if isinstance(value, ng.p.Parameter):
            out[name] = value
        elif is_grid_search(value):
            raise ValueError(
                f"`{name}` is a grid_search, which Nevergrad cannot sample: use choice(...)"
            )
        elif isinstance(value, domains.Domain):
            out[name] = _parameter(ng, name, value)
    return out


def _parameter(ng: Any, name: str, domain: domains.Domain) -> Any:
    """One domain as a Nevergrad parameter (Ray's mapping; upper bounds Ray excludes are
    made inclusive as integers)."""
    quantized = (domains.QUniform, domains.QLogUniform, domains.QNormal, domains.QRandInt)
    if isinstance(domain, (*quantized, domains.QLogRandInt)):
        logger.warning("Nevergrad cannot quantize `%s`: q is dropped", name)
    match domain:
        case domains.Uniform(lower=lo, upper=hi) | domains.QUniform(lower=lo, upper=hi):
            return ng.p.Scalar(lower=lo, upper=hi)
        case domains.LogUniform(lower=lo, upper=hi) | domains.QLogUniform(lower=lo, upper=hi):
            # Nevergrad scales the log-mutation to the bounds (Ray fixes its base at e)
            return ng.p.Log(lower=lo, upper=hi)
        case domains.RandInt(lower=lo, upper=hi):
            return _integers(ng.p.Scalar, lo, hi - 1)  # Ray's upper is excluded
        case domains.QRandInt(first=lo, last=hi):
            return _integers(ng.p.Scalar, lo, hi)  # the values qrandint samples
        case domains.LogRandInt(lower=lo, upper=hi):
            return _integers(ng.p.Log, lo, hi - 1)
        case domains.QLogRandInt(first=lo, last=hi):
            return _integers(ng.p.Log, lo, hi)
        case domains.Normal(mean=mean, sd=sd) | domains.QNormal(mean=mean, sd=sd):
            return ng.p.Scalar(init=mean).set_mutation(sigma=sd)
        case domains.Categorical(categories=categories):
            return ng.p.Choice(list(categories))
        case _:
            raise ValueError(
                f"Nevergrad cannot sample `{name}` ({type(domain).__name__}): use uniform, "
                "loguniform, randint, lograndint, randn, choice or their q-forms"
            )


def _integers(kind: Any, lower: int, upper: int) -> Any:
    if lower == upper:
        raise ValueError(
            f"Nevergrad cannot sample integers from [{lower}, {upper}]: a single value is "
            "a constant, put it in param_space as one"
        )
    return kind(lower=lower, upper=upper).set_integer_casting()


def _space_from_dict(space: dict[str, Any]) -> Any:
    """A dict given as ``space``: popflow's domains (converted, as Ray does, with its
    warning) or Nevergrad parameters by name, as one ``ng.p.Dict``."""
    ng = _nevergrad()
    flat = flat_keys(space)
    if any(isinstance(v, domains.Domain) or is_grid_search(v) for v in flat.values()):
        logger.warning(
            "NevergradSearch got popflow search spaces as `space`: they are converted, but "
            "pass them as the run's `param_space` instead (Ray's advice)"
        )
    params = _parameters(ng, flat)
    if not params:
        raise ValueError(
            f"`space` is {space!r}, but holds no search space (popflow domains or Nevergrad "
            "parameters)"
        )
    return ng.p.Dict(**params)


def _nevergrad() -> Any:
    """Nevergrad, imported when first needed (an optional extra)."""
    return require("nevergrad", "nevergrad", "NevergradSearch")


def _is_names(space: Any) -> bool:
    return isinstance(space, list | tuple) and all(isinstance(n, str) for n in space)
