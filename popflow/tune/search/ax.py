"""``ray.tune.search.ax``: Ax's Bayesian optimisation (BoTorch behind ``AxClient``) as a
search algorithm. Needs the ``ax`` extra (``pip install 'popflow[ax]'``).

    from popflow.tune.search.ax import AxSearch
    tuner = tune.Tuner(train, param_space={"x": tune.uniform(0, 1)},
                       tune_config=tune.TuneConfig(search_alg=AxSearch(),
                                                   metric="loss", mode="min", num_samples=20))

As in Ray: the space as Ax's parameter dicts (``range``, ``choice``, ``fixed``; nested
names ``/``-joined), quantization dropped, ``randn`` refused; ``points_to_evaluate``
attached as trials first; ``None`` while Ax waits for data (its Sobol phase is done, or
its parallelism is reached); NaN or infinite results abandoned. popflow differs where a
resume needs it: an ``AxClient`` made here is seeded with the run's seed unless
``random_seed`` is among ``ax_kwargs`` (so a resumed run's replayed calls rebuild the
same experiment and go on with the same suggestions), and a failed trial is logged as
failed to Ax rather than left running. Ax is imported when the searcher is made (its first
import takes tens of seconds: torch and BoTorch).
"""

from __future__ import annotations

import copy
import logging
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from popflow.flows.integrations.search_values import has_domains, is_number, metric_of, plain
from popflow.infra.optional_imports import require
from popflow.schedulers import domains
from popflow.schedulers.search import Searcher
from popflow.schedulers.search.searcher import DEFAULT_METRIC, check_mode
from popflow.schedulers.search_space import flat_keys, is_grid_search, nested_keys

logger = logging.getLogger(__name__)

__all__ = ["AxSearch"]

#: what Ax takes as a fixed value or a choice
_AX_VALUE = (str, bool, int, float)


class AxSearch(Searcher):
    """Ray's ``ray.tune.search.ax.AxSearch``.

    ``space``: Ax's parameter dicts (``{"name", "type", "bounds" | "values" | "value"}``),
    or None to take the run's ``param_space``. ``metric``/``mode``: the objective.
    ``points_to_evaluate``: configs tried first. ``parameter_constraints`` (``"x1 + x2 <=
    1"``) and ``outcome_constraints`` (``"m2 >= 0.5"``): Ax's. ``ax_client``: an
    ``AxClient`` of your own (then none of ``space``, ``metric``, ``mode`` and the
    constraints if it holds an experiment). ``ax_kwargs``: ``AxClient``'s arguments.
    """

    def __init__(
        self,
        space: dict[str, Any] | list[dict[str, Any]] | None = None,
        metric: str | None = None,
        mode: str | None = None,
        points_to_evaluate: list[dict[str, Any]] | None = None,
        parameter_constraints: list[str] | None = None,
        outcome_constraints: list[str] | None = None,
        ax_client: Any = None,
        **ax_kwargs: Any,
    ) -> None:
        _ax_client_module()  # the missing extra named now, as Ray asserts at once
        check_mode(mode)
        if isinstance(mode, list | tuple):
            raise ValueError(f"`mode` is {mode!r}, but must be 'min' or 'max'")
        super().__init__(metric=metric, mode=mode)
        if points_to_evaluate is not None and (
            not isinstance(points_to_evaluate, Sequence)
            or isinstance(points_to_evaluate, str)
            or not all(isinstance(p, Mapping) for p in points_to_evaluate)
        ):
            raise ValueError(
                f"`points_to_evaluate` is {points_to_evaluate!r}, but must be a list of "
                "points (dicts)"
            )
        for name, value in (("parameter", parameter_constraints), ("outcome", outcome_constraints)):
            if value is not None and (
                isinstance(value, str) or not all(isinstance(c, str) for c in value)
            ):
                raise ValueError(
                    f"`{name}_constraints` is {value!r}, but must be a list of strings such "
                    'as "x1 + x2 <= 1"'
                )
        self._space = _own_space(space)
        self._parameter_constraints = parameter_constraints
        self._outcome_constraints = outcome_constraints
        self._points = [flat_keys(dict(p)) for p in points_to_evaluate or []]
        self._ax_kwargs = dict(ax_kwargs)
        self._ax: Any = ax_client
        self._own_client = ax_client is not None
        self._given = (metric, mode)  # what this searcher was given, not the run
        self._seed: int | None = None
        self._ready = False
        self._parameters: list[str] = []
        self._live: dict[str, int] = {}  # trial id -> Ax's trial index
        if self._own_client:
            # Ray sets a client up at once: its experiment names the metric and mode
            self._setup_experiment()

    # -- Ray's protocol -------------------------------------------------------------
    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        """The run's metric, mode and seed where this searcher has none; its
        ``param_space`` as the space unless the searcher has a space or client of its own
        (then False). The experiment is made here, so Ax's refusals come before any trial."""
        if self._seed is None and spec.get("seed") is not None:
            self._seed = int(spec["seed"])
        if self._ready:
            return False
        self.take_run_metric(metric, mode)
        if self._space is not None:
            self._setup_experiment()
            return False
        if has_domains(config):
            self._space = convert_search_space(config)
            self._setup_experiment()
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if not self._ready:
            if self._space is None:
                raise RuntimeError(
                    "AxSearch has no search space: pass `space` or an `ax_client` with an "
                    "experiment to it, or a `param_space` with search spaces to the run"
                )
            self._setup_experiment()
        ax_exceptions = _ax_exceptions()
        if self._points:
            point = self._points.pop(0)
            parameters, index = self._ax.attach_trial(self._full_point(point))
        else:
            try:
                parameters, index = self._ax.get_next_trial()
            except ax_exceptions as e:
                # Ax waits for results (its Sobol phase is used up, or its parallelism)
                logger.debug("AxSearch: no trial now (%s)", e)
                return None
        self._live[trial_id] = index
        return nested_keys(plain(dict(parameters)))

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        index = self._live.pop(trial_id, None)
        if index is None:
            return
        if error:
            # not left RUNNING as in Ray: Ax would count it against its parallelism forever
            self._ax.log_trial_failure(trial_index=index)
            return
        if not result:
            self._ax.abandon_trial(trial_index=index, reason=f"{trial_id} ended without a result")
            return
        raw: dict[str, tuple[float, None]] = {}
        for name in self._told_metrics():
            value = metric_of(result, name)
            if not is_number(value) or not math.isfinite(float(value)):
                # as Ray: Ax is not told NaN or infinite metrics
                why = f"{name}={value!r} reported by {trial_id}"
                logger.warning("AxSearch abandons Ax's trial %d: %s", index, why)
                self._ax.abandon_trial(trial_index=index, reason=why)
                return
            raw[name] = (float(value), None)
        self._ax.complete_trial(trial_index=index, raw_data=raw)

    # -- the experiment --------------------------------------------------------------
    def _setup_experiment(self) -> None:
        """Ray's ``_setup_experiment``: the client (seeded by the run unless told), its
        experiment made from the space unless it holds one, the metric and mode read back."""
        ax_client_module = _ax_client_module()
        if self._metric is None and self._mode:
            self._metric = DEFAULT_METRIC
        if self._ax is None:
            kwargs = {"random_seed": self._seed, "verbose_logging": False, **self._ax_kwargs}
            with warnings.catch_warnings():
                # AxClient is deprecated in Ax 1.3 (the extra pins <1.4, as Ray 2.60 uses it)
                warnings.filterwarnings("ignore", "The `AxClient` class", DeprecationWarning)
                self._ax = ax_client_module.AxClient(**kwargs)
        if _has_experiment(self._ax):
            if any([self._space, self._parameter_constraints, self._outcome_constraints]) or any(
                self._given
            ):
                raise ValueError(
                    "If you create the Ax experiment yourself (by passing an AxClient with an "
                    "experiment), do not pass values for these parameters to AxSearch: space, "
                    "parameter_constraints, outcome_constraints, mode, metric"
                )
        else:
            if not self._space:
                raise ValueError(
                    "You have to create an Ax experiment by calling "
                    "`AxClient.create_experiment()`, or pass an Ax search space as `space` to "
                    "AxSearch, or pass a `param_space` dict to `tune.Tuner()`"
                )
            if self._mode not in ("min", "max"):
                raise ValueError(
                    "AxSearch has no `mode`: pass 'min' or 'max' to it or to `tune.TuneConfig()`"
                )
            self._ax.create_experiment(
                parameters=copy.deepcopy(self._space),
                objectives={
                    self._metric: ax_client_module.ObjectiveProperties(minimize=self._mode != "max")
                },
                parameter_constraints=self._parameter_constraints,
                outcome_constraints=self._outcome_constraints,
            )
        # Ax 1.3's objective is an expression over metric names (Ray 2.60 reads
        # `objective.metric.name`, which Ax 1.3 no longer has)
        objective = self._ax.experiment.optimization_config.objective
        if objective.is_single_objective:
            minimize = objective.minimize
        else:
            minimize = objective.metric_weights[0][1] < 0  # the first objective's sign
        self._mode = "min" if minimize else "max"
        self._metric = objective.metric_names[0]
        self._parameters = list(self._ax.experiment.parameters)
        self._ready = True

    def _told_metrics(self) -> list[str]:
        config = self._ax.experiment.optimization_config
        names = list(config.objective.metric_names)
        for constraint in config.outcome_constraints:
            names += [n for n in constraint.metric_names if n not in names]
        return names

    def _full_point(self, point: dict[str, Any]) -> dict[str, Any]:
        """A point as Ax attaches it: its values for the experiment's parameters, fixed
        ones filled in (Ray passes the point as given, nested keys and all)."""
        params = self._ax.experiment.parameters
        out: dict[str, Any] = {}
        for name, parameter in params.items():
            if name in point:
                out[name] = point[name]
            elif hasattr(parameter, "value") and not hasattr(parameter, "values"):
                out[name] = parameter.value  # a fixed parameter
            else:
                raise ValueError(
                    f"a point of `points_to_evaluate` ({nested_keys(point)!r}) has no value for "
                    f"`{name}`"
                )
        return out


def convert_search_space(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """popflow's (Ray's) search space as Ax's parameter dicts, ``/``-joined names: the
    constants Ax can hold as ``fixed``, then the search spaces (Ray's order)."""
    flat = flat_keys(spec)
    for name, value in flat.items():
        if is_grid_search(value):
            raise ValueError(
                f"`{name}` is a grid_search: grid search parameters cannot be automatically "
                "converted to an Ax search space"
            )
    fixed = [
        {"name": name, "type": "fixed", "value": plain(value)}
        for name, value in flat.items()
        if not isinstance(value, domains.Domain) and isinstance(value, _AX_VALUE)
    ]
    searched = [
        _parameter(name, value) for name, value in flat.items() if isinstance(value, domains.Domain)
    ]
    return fixed + searched


def _parameter(name: str, domain: domains.Domain) -> dict[str, Any]:
    """One domain as an Ax parameter (Ray's mapping: the upper bound Ray excludes made
    inclusive for integers)."""
    quantized = (domains.QUniform, domains.QLogUniform, domains.QRandInt, domains.QLogRandInt)
    if isinstance(domain, quantized):
        logger.warning("AxSearch does not support quantization: q of `%s` is dropped", name)
    match domain:
        case domains.Uniform(lower=lo, upper=hi) | domains.QUniform(lower=lo, upper=hi):
            return _range(name, lo, hi, "float", log=False)
        case domains.LogUniform(lower=lo, upper=hi) | domains.QLogUniform(lower=lo, upper=hi):
            return _range(name, lo, hi, "float", log=True)
        case domains.RandInt(lower=lo, upper=hi):
            return _range(name, lo, hi - 1, "int", log=False)
        case domains.QRandInt(first=lo, last=hi):
            return _range(name, lo, hi, "int", log=False)
        case domains.LogRandInt(lower=lo, upper=hi):
            return _range(name, lo, hi - 1, "int", log=True)
        case domains.QLogRandInt(first=lo, last=hi):
            return _range(name, lo, hi, "int", log=True)
        case domains.Categorical(categories=categories):
            values = [plain(c) for c in categories]
            if not all(isinstance(v, _AX_VALUE) for v in values):
                raise ValueError(
                    f"AxSearch cannot choose among the values of `{name}` ({list(categories)!r}): "
                    "Ax's choices are strings, numbers or bools"
                )
            return {"name": name, "type": "choice", "values": values}
        case _:
            raise ValueError(
                f"AxSearch does not support parameters of type `{type(domain).__name__}` "
                f"(`{name}`): use uniform, loguniform, randint, lograndint, choice or their "
                "q-forms"
            )


def _range(name: str, lower: float, upper: float, value_type: str, log: bool) -> dict[str, Any]:
    if not lower < upper:
        raise ValueError(
            f"AxSearch cannot search `{name}` in [{lower}, {upper}]: a single value is a "
            "constant, put it in param_space as one"
        )
    return {
        "name": name,
        "type": "range",
        "bounds": [lower, upper],
        "value_type": value_type,
        "log_scale": log,
    }


def _own_space(space: Any) -> list[dict[str, Any]] | None:
    """A ``space`` given to the searcher: Ax's parameter dicts, or popflow's domains
    (converted, with Ray's warning)."""
    if space is None:
        return None
    if isinstance(space, Mapping):
        if not space:
            return None
        if not has_domains(space):
            raise TypeError(
                f"`space` is {space!r}: a dict must hold popflow search spaces; Ax's own "
                "space is a list of parameter dicts"
            )
        logger.warning(
            "AxSearch got popflow search spaces as `space`: they are converted, but pass "
            "them as the run's `param_space` instead (Ray's advice)"
        )
        return convert_search_space(dict(space))
    if (
        isinstance(space, Sequence)
        and not isinstance(space, str)
        and all(isinstance(p, Mapping) and "name" in p for p in space)
    ):
        return [dict(p) for p in space] or None
    raise TypeError(
        f"`space` is {space!r}, but must be a list of Ax parameter dicts (each with a "
        "'name'), or a dict of popflow search spaces"
    )


def _has_experiment(client: Any) -> bool:
    """Ax 1.x asserts ("Experiment not set"); older Ax raised ValueError."""
    try:
        _ = client.experiment
    except (AssertionError, ValueError):
        return False
    return True


def _ax_client_module() -> Any:
    """``ax.service.ax_client``, imported when first needed (an optional extra)."""
    require("ax", "ax", "AxSearch")
    return require("ax.service.ax_client", "ax", "AxSearch")


def _ax_exceptions() -> tuple[type[BaseException], ...]:
    """What Ax's ``get_next_trial`` raises while it waits for data."""
    core = require("ax.exceptions.core", "ax", "AxSearch")
    strategy = require("ax.exceptions.generation_strategy", "ax", "AxSearch")
    return (core.DataRequiredError, strategy.MaxParallelismReachedException)
