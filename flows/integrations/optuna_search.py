"""Ray's ``OptunaSearch`` over the real Optuna: each trial's config from an Optuna study's
``ask``, each result ``report``-ed, each end ``tell``-ed.

    from popflow.tune.search.optuna import OptunaSearch
    tuner = tune.Tuner(train, param_space={"lr": tune.loguniform(1e-4, 1e-1)},
                       tune_config=tune.TuneConfig(search_alg=OptunaSearch(), metric="loss",
                                                   mode="min", num_samples=20))

Needs the ``optuna`` extra (``pip install 'popflow[optuna]'``). The sampler is Optuna's
TPE unless one is given (Bergstra et al., "Algorithms for Hyper-Parameter Optimization",
NeurIPS 2011); its seed is ``seed``, else the run's (so a seeded run suggests the same
configs every time, and after a resume: :mod:`popflow.flows.driver.suggestions`). The
study is made when the searcher first needs it, once the run has told it its metric,
mode and seed. Stopping trials early is the scheduler's job, as in Ray: the study's
pruner is Optuna's ``NopPruner``, and intermediate results are reported to it for the
sampler's sake.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from popflow.flows.integrations.search_values import has_domains
from popflow.infra.optional_imports import require
from popflow.schedulers import domains
from popflow.schedulers.search import Searcher
from popflow.schedulers.search_space import flat_keys, is_grid_search, nested_keys
from popflow.tasks.result_keys import DEFAULT_METRIC

logger = logging.getLogger(__name__)


class OptunaSearch(Searcher):
    """Ray's ``ray.tune.search.optuna.OptunaSearch``.

    ``space``: Optuna distributions by name (``"a/b"`` for nested keys), a
    define-by-run function ``fn(trial) -> dict | None`` that calls ``trial.suggest_*``
    (the dict it returns adds constants), or None to take the run's ``param_space``.
    ``metric``/``mode``: a name and ``"min"``/``"max"``, or lists of them for several
    objectives. ``points_to_evaluate``: configs tried first; with ``evaluated_rewards``
    they are not run but told to the study as done. ``sampler``: any Optuna sampler
    (TPE by default, seeded with ``seed``). ``study_name``/``storage``: Optuna's.
    """

    def __init__(
        self,
        space: Mapping[str, Any] | Callable[[Any], dict[str, Any] | None] | None = None,
        metric: str | list[str] | None = None,
        mode: str | list[str] | None = None,
        points_to_evaluate: list[dict[str, Any]] | None = None,
        sampler: Any = None,
        study_name: str | None = None,
        storage: Any = None,
        seed: int | None = None,
        evaluated_rewards: list[Any] | None = None,
    ) -> None:
        ot = _optuna()
        super().__init__(metric=metric, mode=mode)
        if isinstance(metric, list) != isinstance(mode, list) and metric and mode:
            raise ValueError(
                f"`metric` is {metric!r} and `mode` {mode!r}: give both as lists of the same "
                "length (several objectives) or both as one value"
            )
        if isinstance(metric, list) and isinstance(mode, list) and len(metric) != len(mode):
            raise ValueError(f"`metric` has {len(metric)} names but `mode` {len(mode)} modes")
        if sampler is not None and not isinstance(sampler, ot.samplers.BaseSampler):
            raise TypeError(f"`sampler` is {sampler!r}, but must be an optuna sampler")
        if sampler is not None and seed is not None:
            logger.warning("OptunaSearch got a sampler and a seed: the seed goes to the sampler")
        if space is not None and not callable(space) and not isinstance(space, Mapping):
            raise TypeError(
                f"`space` is {space!r}, but must be a dict of optuna distributions, a "
                "define-by-run function or None"
            )
        if evaluated_rewards is not None and len(evaluated_rewards) != len(
            points_to_evaluate or []
        ):
            raise ValueError(
                f"`evaluated_rewards` has {len(evaluated_rewards)} values but "
                f"`points_to_evaluate` {len(points_to_evaluate or [])} points: one each"
            )
        if isinstance(space, Mapping) and space:
            space = (
                convert_search_space(dict(space)) if has_domains(space) else flat_keys(dict(space))
            )
        self._space: Any = space or None
        self._points = [dict(p) for p in points_to_evaluate or []]
        self._rewards = list(evaluated_rewards) if evaluated_rewards is not None else None
        self._sampler = sampler
        self._study_name = study_name or "optuna"
        self._storage = storage
        self._seed = seed
        self._study: Any = None
        self._trials: dict[str, Any] = {}
        self._completed: set[str] = set()

    # -- Ray's protocol -------------------------------------------------------------
    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict[str, Any], **spec: Any
    ) -> bool:
        """The run's metric, mode and seed where this searcher has none; its
        ``param_space`` as the space unless the searcher has its own (then False)."""
        self.take_run_metric(metric, mode)
        if self._seed is None and spec.get("seed") is not None:
            self._seed = spec["seed"]
        if self._space:
            return False
        self._space = convert_search_space(config) or None
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        study = self.study
        if trial_id not in self._trials:
            if callable(self._space):
                self._trials[trial_id] = study.ask()
            else:
                self._trials[trial_id] = study.ask(fixed_distributions=self._space)
        trial = self._trials[trial_id]
        if callable(self._space):
            constants = self._space(trial)
            if constants is not None and (
                not isinstance(constants, dict) or not all(isinstance(k, str) for k in constants)
            ):
                raise TypeError(
                    "the define-by-run function passed as `space` must return None or a dict "
                    f"with str keys, not {constants!r}"
                )
            return nested_keys({**trial.params, **(constants or {})})
        return nested_keys(dict(trial.params))

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        # Optuna takes no intermediate values for several objectives
        if isinstance(self.metric, list) or trial_id in self._completed:
            return
        trial = self._trials.get(trial_id)
        value = result.get(self.metric) if self.metric else None
        step = result.get("training_iteration")
        if trial is None or not _finite(value) or not isinstance(step, int):
            return
        trial.report(float(value), step)

    def on_trial_complete(
        self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False
    ) -> None:
        if trial_id in self._completed or trial_id not in self._trials:
            return
        state = _optuna().trial.TrialState
        if isinstance(self.metric, list):
            values = [(result or {}).get(m) for m in self.metric]
            value: Any = values if all(_finite(v) for v in values) else None
        else:
            one = (result or {}).get(self.metric) if self.metric else None
            value = float(one) if _finite(one) else None
        if value is None:
            # a trial stopped before it reported the metric, or one that failed
            self.study.tell(
                self._trials[trial_id], None, state=state.FAIL if error else state.PRUNED
            )
        else:
            self.study.tell(self._trials[trial_id], value)
        self._completed.add(trial_id)

    def add_evaluated_point(
        self,
        parameters: dict[str, Any],
        value: float,
        error: bool = False,
        pruned: bool = False,
        intermediate_values: list[float] | None = None,
    ) -> None:
        """A config already evaluated elsewhere, told to the study as a finished trial."""
        if callable(self._space):
            raise TypeError(
                "evaluated points need `space` as optuna distributions (or the run's "
                "param_space), not a define-by-run function"
            )
        study = self.study
        state = _optuna().trial.TrialState
        trial = _optuna().trial.create_trial(
            state=state.FAIL if error else state.PRUNED if pruned else state.COMPLETE,
            value=None if error else value,
            params=flat_keys(parameters),
            distributions=self._space,
            intermediate_values=dict(enumerate(intermediate_values or [])) or None,
        )
        study.add_trial(trial)

    # -- the study ------------------------------------------------------------------
    @property
    def study(self) -> Any:
        """The Optuna study, made on first use (once the run told its metric and mode)."""
        if self._study is None:
            self._study = self._new_study()
        return self._study

    def _new_study(self) -> Any:
        ot = _optuna()
        if not self._space:
            raise RuntimeError(
                "OptunaSearch has no search space: pass `space`, or a `param_space` with "
                "search spaces to the run"
            )
        if self._metric is None and self._mode:
            if isinstance(self._mode, list):
                raise ValueError("with several objectives (`mode` a list), name each `metric`")
            self._metric = DEFAULT_METRIC
        if not self._metric or not self._mode:
            raise RuntimeError(
                f"OptunaSearch has metric={self._metric!r} and mode={self._mode!r}: pass "
                "both to it, or to the run"
            )
        modes = self._mode if isinstance(self._mode, list) else [self._mode]
        directions = ["minimize" if m == "min" else "maximize" for m in modes]
        study = ot.create_study(
            storage=self._storage,
            sampler=self._sampler or ot.samplers.TPESampler(seed=self._seed),
            pruner=ot.pruners.NopPruner(),
            study_name=self._study_name,
            load_if_exists=self._storage is not None,
            directions=directions,
        )
        self._study = study
        if self._rewards is not None:
            for point, reward in zip(self._points, self._rewards, strict=True):
                self.add_evaluated_point(point, reward)
        else:
            for point in self._points:
                study.enqueue_trial(flat_keys(point))
        return study


def convert_search_space(space: dict[str, Any]) -> dict[str, Any]:
    """popflow's (Ray's) search space as Optuna distributions, by ``/``-joined name;
    constants are left to the run's ``param_space``."""
    dist = _optuna().distributions
    out: dict[str, Any] = {}
    for name, domain in flat_keys(space).items():
        if is_grid_search(domain):
            raise ValueError(
                f"`{name}` is a grid_search, which Optuna cannot sample: use choice(...)"
            )
        if not isinstance(domain, domains.Domain):
            continue
        match domain:
            case domains.Uniform(lower=lo, upper=hi):
                out[name] = dist.FloatDistribution(lo, hi)
            case domains.QUniform(lower=lo, upper=hi, q=q):
                out[name] = dist.FloatDistribution(lo, hi, step=q)
            case domains.LogUniform(lower=lo, upper=hi) | domains.QLogUniform(lower=lo, upper=hi):
                if isinstance(domain, domains.QLogUniform):
                    logger.warning("Optuna cannot quantize a log-uniform `%s`: q is dropped", name)
                out[name] = dist.FloatDistribution(lo, hi, log=True)
            case domains.RandInt(lower=lo, upper=hi):
                out[name] = dist.IntDistribution(lo, hi - 1)  # Ray's upper is excluded
            case domains.QRandInt(first=lo, last=hi, q=q):
                out[name] = dist.IntDistribution(lo, hi, step=q)  # the multiples it samples
            case domains.LogRandInt(lower=lo, upper=hi):
                out[name] = dist.IntDistribution(lo, hi - 1, log=True)
            case domains.QLogRandInt(first=lo, last=hi, q=1):
                out[name] = dist.IntDistribution(lo, hi, log=True)
            case domains.QLogRandInt(q=q):
                # Ray passes step=q with log=True, which Optuna refuses
                raise ValueError(
                    f"Optuna cannot sample `{name}` (qlograndint with q={q}): it has no "
                    "log-scale integers with a step; use lograndint or qrandint"
                )
            case domains.Categorical(categories=categories):
                out[name] = dist.CategoricalDistribution(list(categories))
            case _:
                raise ValueError(
                    f"Optuna cannot sample `{name}` ({type(domain).__name__}): use uniform, "
                    "loguniform, randint, lograndint, choice or their q-forms (not randn, "
                    "qrandn)"
                )
    return out


def _optuna() -> Any:
    """Optuna, imported when first needed (an optional extra)."""
    return require("optuna", "optuna", "OptunaSearch")


def _finite(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )
