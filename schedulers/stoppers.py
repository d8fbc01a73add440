"""Ray Tune's stoppers (``ray.tune.stopper``), with Ray's arguments and semantics.

A stopper sees every result on the driver, in the order the driver takes
them: ``stopper(trial_id, result)`` is True when that trial should end
there, ``stopper.stop_all()`` when the whole experiment should. Pass one as
``stop=`` (``RunConfig(stop=...)``). Unlike a plain function (which runs
on the workers), a stopper keeps state across results; popflow commits that
state (:meth:`Stopper.get_state`), so a resumed run stops where an
uninterrupted one would (``TimeoutStopper`` counts only time spent running).

    >>> stopper = CombinedStopper(MaximumIterationStopper(2), TrialPlateauStopper("loss"))
    >>> [stopper("t1", {"loss": 1.0}), stopper("t1", {"loss": 0.5})]
    [False, True]
"""

from __future__ import annotations

import datetime
import math
import time
from collections.abc import Callable
from typing import Any

from popflow.schedulers.validation import check_mode

__all__ = [
    "CombinedStopper",
    "ExperimentPlateauStopper",
    "FunctionStopper",
    "MaximumIterationStopper",
    "NoopStopper",
    "Stopper",
    "TimeoutStopper",
    "TrialPlateauStopper",
]


def _std(values: list[float]) -> float:
    """Population standard deviation (numpy's default, as Ray uses); inf if not numbers."""
    try:
        numbers = [float(v) for v in values]
    except (TypeError, ValueError):
        return math.inf
    mean = sum(numbers) / len(numbers)
    return math.sqrt(sum((v - mean) ** 2 for v in numbers) / len(numbers))


class Stopper:
    """Base class: override ``__call__`` (one trial) and ``stop_all`` (the experiment)."""

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        raise NotImplementedError

    def stop_all(self) -> bool:
        raise NotImplementedError

    def get_state(self) -> dict[str, Any]:
        """What a resumed run needs to go on stopping as this one would (JSON values)."""
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        """Take back :meth:`get_state`'s state."""


class NoopStopper(Stopper):
    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        return False


class FunctionStopper(Stopper):
    """A function ``(trial_id, result) -> bool`` as a stopper (run on the driver)."""

    def __init__(self, function: Callable[[str, dict[str, Any]], bool]) -> None:
        if not callable(function):
            raise TypeError(f"`function` must be callable, got {function!r}")
        self._fn = function

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return bool(self._fn(trial_id, result))

    def stop_all(self) -> bool:
        return False


class MaximumIterationStopper(Stopper):
    """Stops each trial at its ``max_iter``-th result."""

    def __init__(self, max_iter: int) -> None:
        if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
            raise ValueError(f"`max_iter` is {max_iter!r}, but must be an int >= 1")
        self._max_iter = max_iter
        self._iter: dict[str, int] = {}

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        self._iter[trial_id] = self._iter.get(trial_id, 0) + 1
        return self._iter[trial_id] >= self._max_iter

    def stop_all(self) -> bool:
        return False

    def get_state(self) -> dict[str, Any]:
        return {"iter": dict(self._iter)}

    def set_state(self, state: dict[str, Any]) -> None:
        self._iter = dict(state["iter"])


class TrialPlateauStopper(Stopper):
    """Stops a trial once its last ``num_results`` values of ``metric`` vary less than
    ``std`` (after ``grace_period`` results; with ``metric_threshold``, only once the
    metric is at least that good in ``mode``)."""

    def __init__(
        self,
        metric: str,
        std: float = 0.01,
        num_results: int = 4,
        grace_period: int = 4,
        metric_threshold: float | None = None,
        mode: str | None = None,
    ) -> None:
        if not isinstance(metric, str):
            raise TypeError(f"`metric` must be a result key (a string), got {metric!r}")
        if metric_threshold is not None and mode not in ("min", "max"):
            raise ValueError(
                f"with a `metric_threshold`, `mode` must be 'min' or 'max', got {mode!r}"
            )
        for name, value in (("num_results", num_results), ("grace_period", grace_period)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` is {value!r}, but must be an int >= 1")
        self._metric, self._std, self._mode = metric, std, mode
        self._num_results, self._grace_period = num_results, grace_period
        self._metric_threshold = metric_threshold
        self._iter: dict[str, int] = {}
        self._window: dict[str, list[Any]] = {}

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        value = result.get(self._metric)
        window = self._window.setdefault(trial_id, [])
        window.append(value)
        del window[: -self._num_results]
        self._iter[trial_id] = self._iter.get(trial_id, 0) + 1
        if self._iter[trial_id] < self._grace_period or len(window) < self._num_results:
            return False
        if self._metric_threshold is not None:
            worse = (
                value > self._metric_threshold
                if self._mode == "min"
                else value < self._metric_threshold
            )
            if worse:
                return False
        return _std(window) < self._std

    def stop_all(self) -> bool:
        return False

    def get_state(self) -> dict[str, Any]:
        return {"iter": dict(self._iter), "window": {k: list(v) for k, v in self._window.items()}}

    def set_state(self, state: dict[str, Any]) -> None:
        self._iter = dict(state["iter"])
        self._window = {k: list(v) for k, v in state["window"].items()}


class ExperimentPlateauStopper(Stopper):
    """Stops the experiment once the ``top`` best values of ``metric`` over all results
    vary by at most ``std``, for ``patience`` more results."""

    def __init__(
        self, metric: str, std: float = 0.001, top: int = 10, mode: str = "min", patience: int = 0
    ) -> None:
        check_mode(mode)
        if mode is None:
            raise ValueError("`mode` must be 'min' or 'max'")
        if isinstance(top, bool) or not isinstance(top, int) or top <= 1:
            raise ValueError(f"`top` is {top!r}, but must be an int > 1")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
            raise ValueError(f"`patience` is {patience!r}, but must be an int >= 0")
        if not isinstance(std, float) or std <= 0:
            raise ValueError(f"`std` is {std!r}, but must be a float > 0")
        self._metric, self._std, self._top, self._mode = metric, std, top, mode
        self._patience = patience
        self._iterations = 0
        self._top_values: list[float] = []

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        values = sorted([*self._top_values, result[self._metric]])
        self._top_values = values[: self._top] if self._mode == "min" else values[-self._top :]
        self._iterations = self._iterations + 1 if self.has_plateaued() else 0
        return self.stop_all()

    def has_plateaued(self) -> bool:
        return len(self._top_values) == self._top and _std(self._top_values) <= self._std

    def stop_all(self) -> bool:
        return self.has_plateaued() and self._iterations >= self._patience

    def get_state(self) -> dict[str, Any]:
        return {"iterations": self._iterations, "top": list(self._top_values)}

    def set_state(self, state: dict[str, Any]) -> None:
        self._iterations, self._top_values = state["iterations"], list(state["top"])


class TimeoutStopper(Stopper):
    """Stops the experiment after ``timeout`` seconds (or a ``timedelta``) of running;
    time while no driver runs (between a crash and its resume) does not count."""

    def __init__(self, timeout: float | datetime.timedelta) -> None:
        if isinstance(timeout, datetime.timedelta):
            seconds = timeout.total_seconds()
        elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
            seconds = float(timeout)
        else:
            raise ValueError(
                f"`timeout` must be a number of seconds or a datetime.timedelta, got {timeout!r}"
            )
        self._timeout_seconds = seconds
        self._budget = seconds
        self._last_check: float | None = None

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        now = time.monotonic()
        if self._last_check is not None:
            self._budget -= now - self._last_check
        self._last_check = now
        return self._budget <= 0

    def get_state(self) -> dict[str, Any]:
        return {"budget": self._budget}

    def set_state(self, state: dict[str, Any]) -> None:
        self._budget, self._last_check = state["budget"], None


class CombinedStopper(Stopper):
    """Stops when any of ``stoppers`` does (in order, as Ray: the first that says so ends
    the check for that result)."""

    def __init__(self, *stoppers: Stopper) -> None:
        for s in stoppers:
            if not isinstance(s, Stopper):
                raise TypeError(f"CombinedStopper takes Stoppers, got {s!r}")
        self._stoppers = stoppers

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return any(s(trial_id, result) for s in self._stoppers)

    def stop_all(self) -> bool:
        return any(s.stop_all() for s in self._stoppers)

    def get_state(self) -> dict[str, Any]:
        return {"stoppers": [s.get_state() for s in self._stoppers]}

    def set_state(self, state: dict[str, Any]) -> None:
        for s, sub in zip(self._stoppers, state["stoppers"], strict=True):
            s.set_state(sub)
