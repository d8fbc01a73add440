"""Ray's ``HyperOptSearch`` over the real HyperOpt: each trial's config from HyperOpt's
TPE (``hyperopt.tpe.suggest``), each trial's end told to its ``Trials`` as a loss.

    from popflow.tune.search.hyperopt import HyperOptSearch
    tuner = tune.Tuner(train, param_space={"lr": tune.loguniform(1e-4, 1e-1)},
                       tune_config=tune.TuneConfig(search_alg=HyperOptSearch(), metric="loss",
                                                   mode="min", num_samples=20))

or with HyperOpt's own space, conditional ones included (a ``hp.choice`` of dicts):

    from hyperopt import hp
    space = {"opt": hp.choice("opt", [{"name": "sgd", "m": hp.uniform("m", 0, 1)},
                                      {"name": "adam"}]),
             "lr": hp.loguniform("lr", -9, -2)}
    searcher = HyperOptSearch(space, metric="loss", mode="min")

Needs the ``hyperopt`` extra (``pip install 'popflow[hyperopt]'``). TPE is Bergstra et
al.'s ("Algorithms for Hyper-Parameter Optimization", NeurIPS 2011); its first
``n_initial_points`` suggestions are random. HyperOpt minimises, so a ``"max"`` metric
is told negated. As in Ray, each suggestion of the model draws its seed from one
``numpy.random.RandomState``, seeded with ``random_state_seed``, else with the run's
seed: a seeded run suggests the same configs every time, and after a resume, whose
replayed calls rebuild the same ``Trials`` (:mod:`popflow.flows.driver.suggestions`).
The ``Trials`` and that state are made when the searcher first suggests, once the run
has told it its metric, mode and seed.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from popflow.flows.integrations.search_values import has_domains, is_number, metric_of, plain
from popflow.infra.optional_imports import require
from popflow.schedulers import domains
from popflow.schedulers.search import Searcher
from popflow.schedulers.search_space import flat_keys, is_grid_search
from popflow.tasks.result_keys import DEFAULT_METRIC

logger = logging.getLogger(__name__)

#: Ray's range for the seed each model suggestion draws (``randint(2**31 - 1)``)
_SEED_RANGE = 2**31 - 1


class HyperOptSearch(Searcher):
    """Ray's ``ray.tune.search.hyperopt.HyperOptSearch``.

    ``space``: a dict of HyperOpt's ``hp`` expressions (nested dicts, ``hp.choice`` of
    dicts for conditional spaces; constants are kept in each config), a dict of
    popflow's search spaces (converted, as Ray does), or None to take the run's
    ``param_space``. ``metric``/``mode``: Ray's. ``points_to_evaluate``: configs tried
    first, in order; each gives a value for every parameter its choices use (a
    ``hp.choice`` by its category's value). ``n_initial_points``: random suggestions
    before TPE models (None: HyperOpt's default). ``random_state_seed``: the seed
    (None: the run's). ``gamma``: TPE's quantile of good trials.
    """

    def __init__(
        self,
        space: dict[str, Any] | None = None,
        metric: str | None = None,
        mode: str | None = None,
        points_to_evaluate: list[dict[str, Any]] | None = None,
        n_initial_points: int | None = 20,
        random_state_seed: int | None = None,
        gamma: float | None = 0.25,
    ) -> None:
        hpo = _hyperopt()
        super().__init__(metric=metric, mode=mode)
        if space is not None and not isinstance(space, Mapping):
            raise TypeError(
                f"`space` is {space!r}, but must be a dict of hyperopt expressions (hp.*), "
                "a dict of search spaces or None"
            )
        if points_to_evaluate is not None and (
            not isinstance(points_to_evaluate, Sequence)
            or isinstance(points_to_evaluate, str)
            or not all(isinstance(p, Mapping) for p in points_to_evaluate)
        ):
            raise ValueError(
                f"`points_to_evaluate` is {points_to_evaluate!r}, but must be a list of "
                "points (dicts)"
            )
        if n_initial_points is not None and (
            not isinstance(n_initial_points, int) or n_initial_points < 0
        ):
            raise ValueError(
                f"`n_initial_points` is {n_initial_points!r}, but must be an int >= 0 or None"
            )
        if gamma is not None and not (is_number(gamma) and 0 < gamma < 1):
            raise ValueError(f"`gamma` is {gamma!r}, but must be a number in (0, 1) or None")
        algo_kwargs: dict[str, Any] = {"verbose": False}  # its timings at INFO are noise
        if n_initial_points is not None:
            algo_kwargs["n_startup_jobs"] = n_initial_points
        if gamma is not None:
            algo_kwargs["gamma"] = gamma
        self._algo = partial(hpo.tpe.suggest, **algo_kwargs)
        self._seed = random_state_seed
        self._points = [copy.deepcopy(dict(p)) for p in points_to_evaluate or []]
        self._space: dict[str, Any] | None = None
        self._point_vals: list[dict[str, Any]] = []  # each point as HyperOpt's label values
        if space:
            space = dict(space)
            if has_domains(space):
                logger.warning(
                    "HyperOptSearch got popflow search spaces as `space`: they are converted, "
                    "but pass them as the run's `param_space` instead (Ray's advice)"
                )
                space = _convert(space, keep_constants=True)
            self._set_space(space)
        # made on first suggestion: the run's seed is known by then
        self._trials: Any = None
        self._domain: Any = None
        self._rstate: np.random.RandomState | None = None
        self._points_asked = 0
        self._live: dict[str, dict[str, Any]] = {}  # trial id -> its HyperOpt trial doc

    # -- Ray's protocol -------------------------------------------------------------
    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        """The run's metric, mode and seed where this searcher has none; its
        ``param_space`` as the space unless the searcher has its own (then False)."""
        self.take_run_metric(metric, mode)
        if self._seed is None and spec.get("seed") is not None:
            self._seed = int(spec["seed"])
        if self._metric is None and self._mode:
            self._metric = DEFAULT_METRIC  # Ray's anonymous metric
        if self._metric and not self._mode:
            raise ValueError(
                f"HyperOptSearch has metric={self._metric!r} but no mode: pass mode='min' "
                "or 'max' to it, or to the run"
            )
        if self._space is not None:
            return False
        space = convert_search_space(config)
        if not space:
            raise RuntimeError(
                "HyperOptSearch has no search space: pass `space`, or a `param_space` with "
                "search spaces to the run (HyperOpt cannot search constants only)"
            )
        self._set_space(space)
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        hpo = _hyperopt()
        trials, domain = self._setup()
        if self._points_asked < len(self._point_vals):
            # a point as its own trial doc: TPE learns from it once it is told its loss
            vals = self._point_vals[self._points_asked]
            self._points_asked += 1
            [tid] = trials.new_trial_ids(1)
            misc = {
                "tid": tid,
                "cmd": domain.cmd,
                "workdir": domain.workdir,
                "idxs": {label: [tid] if label in vals else [] for label in domain.params},
                "vals": {label: [vals[label]] if label in vals else [] for label in domain.params},
            }
            doc = trials.new_trial_docs([tid], [None], [domain.new_result()], [misc])[0]
        else:
            assert self._rstate is not None
            new_ids = trials.new_trial_ids(1)
            # one draw per model suggestion, none otherwise: a replay of the same calls
            # reaches the same state
            seed = int(self._rstate.randint(_SEED_RANGE))
            [doc] = self._algo(new_ids, domain, trials, seed)
        [tid] = trials.insert_trial_docs([doc])
        trials.refresh()
        # the doc the Trials keeps (inserting copies it), to mark its end on
        doc = next(d for d in trials.trials if d["tid"] == tid)
        self._live[trial_id] = doc
        config = _evaluate(domain, hpo.base.spec_from_misc(doc["misc"]))
        return plain(copy.deepcopy(config))

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        doc = self._live.get(trial_id)
        if doc is not None:  # what Ray marks: the trial runs (TPE reads neither)
            doc["book_time"] = doc["refresh_time"] = _hyperopt().utils.coarse_utcnow()

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        hpo = _hyperopt()
        doc = self._live.pop(trial_id, None)
        if doc is None:
            return
        doc["refresh_time"] = hpo.utils.coarse_utcnow()
        if error:
            # out of the Trials (HyperOpt's valid states exclude it), as in Ray
            doc["state"] = hpo.base.JOB_STATE_ERROR
            doc["misc"]["error"] = ("TuneError", "Tune Error")
        elif result:
            value = metric_of(result, self.metric)
            doc["state"] = hpo.base.JOB_STATE_DONE
            if is_number(value) and math.isfinite(float(value)):
                sign = -1.0 if self.mode == "max" else 1.0  # HyperOpt minimises
                doc["result"] = {"loss": sign * float(value), "status": hpo.STATUS_OK}
            else:
                # Ray raises here; popflow's searchers warn, and TPE takes it as failed
                logger.warning(
                    "HyperOptSearch: trial %s ended without a finite number for `%s` (%r): "
                    "told as failed",
                    trial_id,
                    self.metric,
                    value,
                )
                doc["result"] = {"status": hpo.STATUS_FAIL}
        self._trials.refresh()

    # -- HyperOpt's side ------------------------------------------------------------
    def _set_space(self, space: dict[str, Any]) -> None:
        """The space, and the points as label values in it (checked now, before a run)."""
        domain = _hyperopt().Domain(_identity, space)
        self._point_vals = [_point_vals(domain, point) for point in self._points]
        self._space = space

    def _setup(self) -> tuple[Any, Any]:
        """The ``Trials`` and ``Domain``, made (with the seed's state) on first use."""
        if self._trials is None:
            hpo = _hyperopt()
            if self._space is None:
                raise RuntimeError(
                    "HyperOptSearch has no search space: pass `space`, or a `param_space` "
                    "with search spaces to the run"
                )
            if self._metric is None and self._mode:
                self._metric = DEFAULT_METRIC
            if not self._metric or not self._mode:
                raise RuntimeError(
                    f"HyperOptSearch has metric={self._metric!r} and mode={self._mode!r}: "
                    "pass both to it, or to the run"
                )
            self._domain = hpo.Domain(_identity, self._space)
            self._rstate = np.random.RandomState(self._seed)
            self._trials = hpo.Trials()
        return self._trials, self._domain


def convert_search_space(space: dict[str, Any]) -> dict[str, Any]:
    """popflow's (Ray's) search space as HyperOpt's, nested as given, each parameter
    labelled by its ``/``-joined path; constants are left to the run's ``param_space``."""
    return _convert(space, keep_constants=False)


def _convert(space: dict[str, Any], keep_constants: bool, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in space.items():
        label = f"{prefix}{key}"
        if is_grid_search(value):
            raise ValueError(
                f"`{label}` is a grid_search, which HyperOpt cannot sample: use choice(...)"
            )
        if isinstance(value, domains.Domain):
            out[key] = _expression(label, value)
        elif isinstance(value, dict) and value:
            sub = _convert(value, keep_constants, f"{label}/")
            if sub or keep_constants:
                out[key] = sub
        elif keep_constants:
            out[key] = value
    return out


def _expression(label: str, domain: domains.Domain) -> Any:
    """One domain as a HyperOpt expression (Ray's mapping; bounds as popflow's domains
    have them)."""
    hpo = _hyperopt()
    hp, as_int = hpo.hp, hpo.pyll.scope.int
    match domain:
        case domains.Uniform(lower=lo, upper=hi):
            return hp.uniform(label, lo, hi)
        case domains.QUniform(lower=lo, upper=hi, q=q):
            return hp.quniform(label, lo, hi, q)
        case domains.LogUniform(lower=lo, upper=hi):
            # HyperOpt's bounds are natural logs; the base does not change the distribution
            return hp.loguniform(label, math.log(lo), math.log(hi))
        case domains.QLogUniform(lower=lo, upper=hi, q=q):
            return hp.qloguniform(label, math.log(lo), math.log(hi), q)
        case domains.Normal(mean=mean, sd=sd):
            return hp.normal(label, mean, sd)
        case domains.QNormal(mean=mean, sd=sd, q=q):
            return hp.qnormal(label, mean, sd, q)
        case domains.RandInt(lower=lo, upper=hi):
            _check_range(label, lo, hi - 1)
            return hp.uniformint(label, lo, hi - 1)  # Ray's upper is excluded
        case domains.QRandInt(first=lo, last=hi, q=q):
            _check_range(label, lo, hi)
            return as_int(hp.quniform(label, lo, hi, q))  # the multiples qrandint samples
        case domains.QLogRandInt(first=lo, last=hi, q=q):
            _check_range(label, lo, hi)
            return as_int(hp.qloguniform(label, math.log(lo), math.log(hi), q))
        case domains.LogRandInt(lower=lo, upper=hi):
            _check_range(label, lo, hi - 1)
            return as_int(hp.qloguniform(label, math.log(lo), math.log(hi - 1), 1))
        case domains.Categorical(categories=categories):
            return hp.choice(
                label, [_category(f"{label}/{i}", c) for i, c in enumerate(categories)]
            )
        case _:
            raise ValueError(
                f"HyperOpt cannot sample `{label}` ({type(domain).__name__}): use uniform, "
                "loguniform, randn, randint, lograndint, choice or their q-forms"
            )


def _category(label: str, category: Any) -> Any:
    """A category of a choice, its search spaces (in a dict, a list or itself) converted;
    labelled by the category's index, so two branches may use the same names."""
    if isinstance(category, domains.Domain):
        return _expression(label, category)
    if isinstance(category, dict) and has_domains(category):
        return _convert(category, keep_constants=True, prefix=f"{label}/")
    if isinstance(category, list) and any(isinstance(c, domains.Domain) for c in category):
        return [_category(f"{label}/{i}", c) for i, c in enumerate(category)]
    return category


def _check_range(label: str, lower: int, upper: int) -> None:
    if lower >= upper:
        raise ValueError(
            f"HyperOpt cannot sample integers from [{lower}, {upper}] for `{label}`: a single "
            "value is a constant, put it in param_space as one"
        )


def _point_vals(domain: Any, point: dict[str, Any]) -> dict[str, Any]:
    """A point of ``points_to_evaluate`` as the label values HyperOpt keeps for a trial:
    the labels it uses only, a choice by its category's index (Ray's rule)."""
    hpo = _hyperopt()
    flat = {**flat_keys(point), **{k: v for k, v in point.items() if k in domain.params}}
    vals = {label: flat[label] for label in domain.params if label in flat}
    for node in hpo.pyll.dfs(domain.expr):
        if node.name != "switch":
            continue
        label = node.pos_args[0].arg["label"].obj
        if label in vals:
            vals[label] = _category_index(label, node.pos_args[1:], vals[label])
    try:
        _evaluate(domain, vals)
    except (AssertionError, TypeError) as e:
        # HyperOpt's way of saying a parameter the config uses has no value
        missing = sorted(set(domain.params) - set(vals))
        raise ValueError(
            f"a point of `points_to_evaluate` ({point!r}) lacks a value the space needs, "
            f"one of {missing}: give every parameter its choices use"
        ) from e
    # the labels its choices leave unused are not kept (TPE would learn from them)
    return {
        label: value
        for label, value in vals.items()
        if not _evaluates({k: v for k, v in vals.items() if k != label}, domain)
    }


def _category_index(label: str, options: Sequence[Any], value: Any) -> int:
    pyll = _hyperopt().pyll
    for i, option in enumerate(options):
        # constant options only (a branch with parameters is not a value to give)
        if any(n.name == "hyperopt_param" for n in pyll.dfs(option)):
            continue
        if pyll.rec_eval(option) == value:
            return i
    raise ValueError(
        f"a point of `points_to_evaluate` gives `{label}` the value {value!r}, which is not "
        "one of its constant categories: give the category's value itself"
    )


def _evaluate(domain: Any, vals: dict[str, Any]) -> Any:
    """The config HyperOpt's label values make (as ``hyperopt.space_eval``)."""
    hpo = _hyperopt()
    memo = domain.memo_from_config(vals)
    return hpo.pyll.rec_eval(domain.expr, memo=memo, print_node_on_error=False)


def _evaluates(vals: dict[str, Any], domain: Any) -> bool:
    try:
        _evaluate(domain, vals)
    except (AssertionError, TypeError):
        return False
    return True


def _hyperopt() -> Any:
    """HyperOpt, imported when first needed (an optional extra)."""
    return require("hyperopt", "hyperopt", "HyperOptSearch")


def _identity(config: Any) -> Any:
    # the Domain's objective: never called (trials are evaluated by the run); a module
    # function, so that the searcher pickles
    return config
