"""What ``popflow.run`` returns: Ray Tune's ``ResultGrid`` and ``Result``."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from popflow.flows.experiment.reading import CommittedExperiment, read_committed
from popflow.flows.experiment.trial_logs import result_lines
from popflow.flows.experiment.trial_table import TrialRecord
from popflow.infra.storage.credentials import StorageOptions, without_secrets
from popflow.infra.storage.folder import Storage, StorageError
from popflow.infra.store.layout import RESULTS
from popflow.tasks.checkpoint import Checkpoint

if TYPE_CHECKING:
    import pandas as pd

SCOPES = ("last", "avg", "last-5-avg", "last-10-avg", "all")


class History(Sequence[dict[str, Any]]):
    """A trial's results in order, read from its ``result.json`` when first used: the
    driver keeps only each trial's last result in memory, however long the run."""

    def __init__(self, results: list[dict[str, Any]] | Callable[[], list[dict[str, Any]]]):
        self._results = results if isinstance(results, list) else None
        self._load = None if isinstance(results, list) else results

    def _listed(self) -> list[dict[str, Any]]:
        if self._results is None:
            assert self._load is not None
            self._results, self._load = self._load(), None
        return self._results

    def __len__(self) -> int:
        return len(self._listed())

    def __getitem__(self, i: Any) -> Any:
        return self._listed()[i]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._listed())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"History({len(self)} results)" if self._results is not None else "History(...)"


class ResultLog:
    """Where a trial's history is read from: its folder in the experiment's storage.

    Like a :class:`~popflow.tasks.checkpoint.Checkpoint`, its pickled form (a
    pickled :class:`Result` or :class:`ResultGrid`, a Prefect flow's persisted
    result) carries no credentials: where it is unpickled they come from the
    environment or the AWS credential chain, and a read that lacks them says so.
    """

    def __init__(self, storage: Storage, dirname: str, count: int, strict: bool) -> None:
        self._storage: Storage | None = storage
        self._url = storage.url
        self._options = StorageOptions(storage.storage_options)
        self.dirname, self.count, self.strict = dirname, count, strict
        self._stripped = False  # credentials were left out of the pickle it came from

    def __getstate__(self) -> dict[str, Any]:
        options = self._options.value
        kept = without_secrets(options)
        return {
            "url": self._url,
            "options": kept,
            "dirname": self.dirname,
            "count": self.count,
            "strict": self.strict,
            "stripped": self._stripped or kept != options,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._storage = None  # made on first use, with the credentials found there
        self._url, self._options = state["url"], StorageOptions(state["options"])
        self.dirname, self.count, self.strict = state["dirname"], state["count"], state["strict"]
        self._stripped = state["stripped"]

    def __call__(self) -> list[dict[str, Any]]:
        if self._storage is None:
            self._storage = Storage(self._url, self._options.value)
        storage = self._storage
        try:
            lines = result_lines(storage, self.dirname, self.count, strict=self.strict)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{storage.full_url(self.dirname)} is gone: a trial's history is read from its "
                f"{RESULTS} when first used, so keep the experiment's folder while you read it"
            ) from None
        except StorageError as e:
            if not self._stripped:
                raise
            raise StorageError(
                e.operation,
                e.url,
                f"{e.reason}; this Result was unpickled, and popflow pickles no credentials: "
                "give them where it is read (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the "
                "AWS credential chain), or read it with ResultGrid.from_path(path, "
                "storage_options)",
                e.errno,
            ) from e
        return [json.loads(line) for line in lines]


class TrialFailure(RuntimeError):
    """``Result.error``: what a trial raised, as an exception, as Ray gives it (its
    ``RayTaskError`` is a ``RuntimeError`` too); ``str()`` is the traceback the trial's
    worker recorded (the original exception lived in another process)."""


@dataclass
class Result:
    """One trial's outcome: its final config and metrics, latest checkpoint, folder, error."""

    config: dict[str, Any]
    metrics: dict[str, Any]
    checkpoint: Checkpoint | None
    path: str
    error: TrialFailure | None = None
    trial_id: str = ""
    status: str = ""
    #: every result of the trial, in order (read from storage on first use)
    history: Sequence[dict[str, Any]] = field(default_factory=list, repr=False)
    best_checkpoints: list[tuple[Checkpoint, dict[str, Any]]] = field(
        default_factory=list, repr=False
    )

    @property
    def metrics_dataframe(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(list(self.history))


def _number(x: Any) -> float | None:
    """``x`` as a float, or None if it is not a number."""
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _finite(x: Any) -> bool:
    v = _number(x)
    return v is not None and math.isfinite(v)


class ResultGrid(Sequence[Result]):
    """The trials of an experiment, as ``popflow.run`` returns them or
    :meth:`from_path` reads them back."""

    def __init__(
        self,
        results: list[Result],
        metric: str | None,
        mode: str | None,
        experiment_path: str,
    ) -> None:
        self._results = results
        self._metric = metric
        self._mode = mode
        self.experiment_path = experiment_path
        #: how the run that returned this ended, as its ``tune`` flow run's state says
        #: (finished, a budget spent, nothing to run); None when read from storage
        self.summary: str | None = None

    @classmethod
    def from_path(
        cls, path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
    ) -> ResultGrid:
        """The grid of the experiment at ``path`` (``<storage>/<name>``: a local folder or an
        fsspec URL) as of its latest commit, with the run's metric and mode.

        Reads only, so an experiment still running can be read as it goes: its
        trials as committed, a trial then running as PENDING (as a resume
        restores it). Ray's ``ResultGrid`` of ``Tuner.restore(path).get_results()``.
        :class:`~popflow.flows.experiment.reading.NoExperiment` (a
        ``FileNotFoundError``) if nothing is committed there.

        >>> grid = ResultGrid.from_path("./results/pbt_benchmark")  # doctest: +SKIP
        >>> grid.get_best_result().config  # doctest: +SKIP
        """
        return committed_results(read_committed(path, storage_options))

    def __len__(self) -> int:
        return len(self._results)

    def __getitem__(self, i: int) -> Result:  # type: ignore[override]
        return self._results[i]

    def __iter__(self) -> Iterator[Result]:
        return iter(self._results)

    def __repr__(self) -> str:
        return (
            f"ResultGrid({len(self)} trials, {self.num_errors} errors, at {self.experiment_path!r})"
        )

    @property
    def errors(self) -> list[TrialFailure]:
        return [r.error for r in self._results if r.error]

    @property
    def num_errors(self) -> int:
        return len(self.errors)

    @property
    def num_terminated(self) -> int:
        return sum(1 for r in self._results if r.status == "TERMINATED")

    @staticmethod
    def _value(
        result: Result, metric: str, mode: str, scope: str, finite_only: bool
    ) -> float | None:
        """The trial's score for ``scope``; None if it has no (finite, if ``finite_only``) value."""
        if scope == "last":  # the final result, as in Ray
            reported = [result.metrics[metric]] if metric in result.metrics else []
        else:  # a Result built without its history still has its final metrics
            reported = [h[metric] for h in (result.history or [result.metrics]) if metric in h]
        values = [v for v in map(_number, reported) if v is not None]
        if finite_only:
            values = [v for v in values if math.isfinite(v)]
        if not values:
            return None
        if scope == "last":
            return values[-1]
        if scope == "all":
            return max(values) if mode == "max" else min(values)
        n = {"avg": len(values), "last-5-avg": 5, "last-10-avg": 10}[scope]
        tail = values[-n:]
        return sum(tail) / len(tail)

    def get_best_result(
        self,
        metric: str | None = None,
        mode: str | None = None,
        scope: str = "last",
        filter_nan_and_inf: bool = True,
    ) -> Result:
        """The best trial by ``metric`` (defaults: the run's metric and mode).

        ``scope``: "last" compares final results; "avg", "last-5-avg",
        "last-10-avg" average over all / the last 5 / the last 10; "all" takes
        each trial's best result. ``filter_nan_and_inf``: ignore NaN and
        infinite values (a trial whose final value is one is never best for
        "last"); if False they count as reported, and a NaN score ranks last.
        Trials that never reported ``metric`` are skipped.
        """
        metric = metric or self._metric
        mode = mode or self._mode
        if not metric or not mode:
            raise ValueError(
                "no metric/mode to rank trials by: pass get_best_result(metric=..., mode=...) "
                "or run(metric=..., mode=...)"
            )
        if mode not in ("min", "max"):
            raise ValueError(f"`mode` is {mode!r}, but must be 'min' or 'max'")
        if scope not in SCOPES:
            raise ValueError(f"`scope` is {scope!r}, but must be one of {SCOPES}")
        sign = 1.0 if mode == "max" else -1.0
        scored = []
        for r in self._results:
            v = self._value(r, metric, mode, scope, finite_only=filter_nan_and_inf)
            if v is not None:  # NaN sorts below every number, in either mode
                scored.append(((not math.isnan(v), sign * v if not math.isnan(v) else 0.0), r))
        if not scored:
            finite = "finite " if filter_nan_and_inf else ""
            raise RuntimeError(f"no trial reported a {finite}{metric!r}; cannot pick a best result")
        return max(scored, key=lambda kr: kr[0])[1]

    # -- Ray's ExperimentAnalysis (what its tune.run returns), on the run's metric and mode --
    def get_best_config(
        self, metric: str | None = None, mode: str | None = None, scope: str = "last"
    ) -> dict[str, Any]:
        return self.get_best_result(metric, mode, scope).config

    @property
    def best_config(self) -> dict[str, Any]:
        return self.get_best_result().config

    @property
    def best_result(self) -> dict[str, Any]:
        return self.get_best_result().metrics

    @property
    def best_checkpoint(self) -> Checkpoint | None:
        return self.get_best_result().checkpoint

    @property
    def results_df(self) -> pd.DataFrame:
        return self.get_dataframe()

    def get_dataframe(
        self, filter_metric: str | None = None, filter_mode: str | None = None
    ) -> pd.DataFrame:
        """One row per trial: its last result (or its best by ``filter_metric``), config as ``config/...``."""
        import pandas as pd

        mode = filter_mode or self._mode
        if filter_metric and mode not in ("min", "max"):
            raise ValueError(
                f"`filter_mode` is {mode!r}, but must be 'min' or 'max' when `filter_metric` "
                "is given (or pass run(mode=...))"
            )
        rows = []
        for r in self._results:
            row = dict(r.metrics)
            if filter_metric:
                hist = [h for h in r.history if _finite(h.get(filter_metric))]
                if hist:
                    pick = max if mode == "max" else min
                    row = dict(pick(hist, key=lambda h: float(h[filter_metric])))
            row.update({f"config/{k}": v for k, v in flatten(r.config).items()})
            row["trial_id"] = r.trial_id
            row["logdir"] = r.path
            rows.append(row)
        return pd.DataFrame(rows)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "/"))
        else:
            out[key] = v
    return out


def checkpoint_of(storage: Storage, rec: TrialRecord, name: str) -> Checkpoint:
    """The handle of ``rec``'s checkpoint ``name`` (``storage``: the experiment's folder)."""
    path = storage.full_url(rec.checkpoint_path(name))
    return Checkpoint(path, storage_options=storage.storage_options)


def latest_checkpoint(storage: Storage, rec: TrialRecord) -> Checkpoint | None:
    """The handle of ``rec``'s latest checkpoint (Ray's ``Trial.checkpoint``), or None."""
    return checkpoint_of(storage, rec, rec.checkpoints[-1].name) if rec.checkpoints else None


def results_of(
    records: list[TrialRecord],
    storage: Storage,
    metric: str | None,
    mode: str | None,
    logs_complete: bool = True,
) -> ResultGrid:
    """The grid of an experiment's trials (``storage``: the experiment's folder).

    ``logs_complete``: the trials' logs hold every committed result (a run that ended);
    else a history is what its log holds so far (an object store's lags its commits).
    """

    def checkpoint(rec: TrialRecord, name: str) -> Checkpoint:
        return checkpoint_of(storage, rec, name)

    out = []
    for rec in records:
        latest = rec.checkpoints[-1].name if rec.checkpoints else None
        out.append(
            Result(
                config=rec.trial.config,
                metrics=rec.trial.last_result,
                checkpoint=checkpoint(rec, latest) if latest else None,
                path=storage.full_url(rec.dirname),
                error=TrialFailure(rec.error) if rec.error else None,
                trial_id=rec.trial_id,
                status=rec.trial.status.value,
                history=History(ResultLog(storage, rec.dirname, rec.num_results, logs_complete)),
                best_checkpoints=[(checkpoint(rec, c.name), c.result) for c in rec.checkpoints],
            )
        )
    return ResultGrid(out, metric, mode, storage.url)


def committed_results(experiment: CommittedExperiment) -> ResultGrid:
    """The grid of an experiment as its latest commit has it."""
    return results_of(
        list(experiment.records),
        experiment.storage,
        experiment.metric,
        experiment.mode,
        logs_complete=False,
    )
