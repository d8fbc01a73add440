"""What a plot of an experiment shows: series, exploits, rungs and stops, computed from
an :class:`~popflow.flows.plots.reading.ExperimentSnapshot` (pure: snapshot in, series
out); :mod:`popflow.flows.plots.reading` reads the snapshot, :mod:`popflow.flows.plots.figures`
draws it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from popflow.flows.experiment.results import Result, flatten
from popflow.flows.experiment.trial_table import stopped_early
from popflow.flows.plots.lineage import Entry, best_trial, lineage
from popflow.flows.plots.reading import ExperimentSnapshot
from popflow.schedulers import TrialStatus

#: A panel's key's value in a result (None: none to draw).
Encoder = Callable[[Any], "float | None"]

#: Schedulers whose trials change config over time (a schedule to draw).
_POPULATION_SCHEDULERS = ("PopulationBasedTraining", "PB2", "PopulationBasedTrainingReplay")


class PlotKind(StrEnum):
    POPULATION = "population"  # PBT, PB2, PBT replay: hyperparameters over time, exploits
    EARLY_STOPPING = "early_stopping"  # ASHA, HyperBand, median stopping, FIFO: rungs, stops


class NoMetric(ValueError):
    """The experiment records no metric, and none was given."""


@dataclass(frozen=True)
class Trace:
    """One line: a trial's values of one key against time, up to an exploit or the end."""

    trial_id: str
    times: tuple[float, ...]
    values: tuple[float, ...]


@dataclass(frozen=True)
class ExploitMark:
    """One exploit: ``target`` cloned ``source``. ``source_at``: the source's point
    (time, value of each panel's key) it was cloned at; ``target_at``: the target's
    first point after it, or while ``pending`` (it has not reported since) the
    source's point with the new config."""

    target: str
    source: str
    target_iteration: int
    source_iteration: int
    source_at: tuple[float, Mapping[str, float]]
    target_at: tuple[float, Mapping[str, float]]
    pending: bool = False


@dataclass(frozen=True)
class StopMark:
    """The last point of a trial that ended before the others (or errored)."""

    trial_id: str
    time: float
    value: float
    status: TrialStatus  # TERMINATED (stopped early) or ERROR


@dataclass(frozen=True)
class PlotData:
    """Everything a figure shows. ``panels``: key -> its traces, the metric first;
    ``categories``: the labels of a non-numeric key's values (coded 0, 1, ...);
    ``rungs_inferred``: the rungs come from where trials stopped, not the scheduler;
    ``best``: the trial with the best last result (None: no mode); ``lineage``: key ->
    the path that led to ``best``'s last result through its exploits (PBT: one trace
    across the trials it went through, ``lineage_trials``); ``errored``: how many
    trials errored, ``first_error`` the last line of the first one's error."""

    name: str
    scheduler: str
    kind: PlotKind
    metric: str
    mode: str | None
    time_attr: str
    trials: tuple[str, ...]
    panels: Mapping[str, tuple[Trace, ...]]
    categories: Mapping[str, tuple[str, ...]]
    exploits: tuple[ExploitMark, ...] = ()
    rungs: tuple[float, ...] = ()
    rungs_inferred: bool = False
    stops: tuple[StopMark, ...] = ()
    round: int = 0
    finished: bool = True
    best: str | None = None
    lineage: Mapping[str, Trace] = field(default_factory=dict)
    lineage_trials: tuple[str, ...] = ()
    errored: int = 0
    first_error: str | None = None


def plot_kind(scheduler: str, state: Mapping[str, Any]) -> PlotKind:
    """The figure for a scheduler (by its recorded class name, else by its state's shape)."""
    if scheduler in _POPULATION_SCHEDULERS:
        return PlotKind.POPULATION
    trials = state.get("trials")
    first = trials[0] if isinstance(trials, list) and trials else None
    if isinstance(first, dict) and "orig_tag" in first:  # a PopulationBasedTraining subclass
        return PlotKind.POPULATION
    return PlotKind.EARLY_STOPPING


def _number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def _iteration(result: Mapping[str, Any]) -> int:
    return int(result.get("training_iteration", 0))


def _config(result: Mapping[str, Any]) -> dict[str, Any]:
    return flatten(result.get("config") or {})


def mutated_keys(results: Sequence[Result], policy: Sequence[Sequence[Any]]) -> tuple[str, ...]:
    """Config keys that change over time: within a trial's results, or by an exploit's
    explore (its new config against the source's)."""
    keys: set[str] = set()
    for r in results:
        first: dict[str, Any] | None = None
        for h in r.history:
            config = _config(h)
            if first is None:
                first = config
            keys.update(k for k in config.keys() | first.keys() if config.get(k) != first.get(k))
    for entry in policy:
        old, new = flatten(entry[4] or {}), flatten(entry[5] or {})
        keys.update(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    return tuple(sorted(keys))


def _encoder(
    results: Sequence[Result],
    policy: Sequence[Sequence[Any]],
    key: str,
    choices: Sequence[Any] | None = None,
) -> tuple[Encoder, tuple[str, ...]]:
    """How ``key``'s values become y values: numbers as they are; otherwise (strings,
    booleans, lists), or numbers PBT picks from a list (``choices``), codes 0, 1, ...
    of their labels (the list's order, else sorted). Returns (encode, labels)."""
    values = [_config(h).get(key) for r in results for h in r.history]
    values += [flatten(e[i] or {}).get(key) for e in policy for i in (4, 5)]
    present = [v for v in values if v is not None]
    listed = [str(v) for v in choices or ()]
    if choices and {str(v) for v in present} <= set(listed):
        labels = tuple(dict.fromkeys(listed))
    elif all(_number(v) is not None for v in present):
        return _number, ()
    else:
        labels = tuple(sorted({str(v) for v in present}))
    codes = {label: float(i) for i, label in enumerate(labels)}
    return (lambda v: None if v is None else codes[str(v)]), labels


def _split(
    history: Sequence[Mapping[str, Any]], time_attr: str, cuts: Sequence[int]
) -> tuple[list[list[Mapping[str, Any]]], list[int | None]]:
    """A trial's results in segments: cut after the result at each exploit's target
    iteration (in order), and wherever time does not increase. Returns the segments
    and, per cut, the index of the segment that starts after it (None: none matched)."""
    segments: list[list[Mapping[str, Any]]] = [[]]
    pending = list(cuts)
    after: list[int | None] = []
    for result in history:
        t = _number(result.get(time_attr))
        if t is None:
            continue
        last = segments[-1][-1] if segments[-1] else None
        if last is not None and t <= float(last[time_attr]):
            segments.append([])
        segments[-1].append(result)
        if pending and _iteration(result) == pending[0]:
            pending.pop(0)
            segments.append([])
            after.append(len(segments) - 1)
    after += [None] * len(pending)
    return segments, after


def _point(
    result: Mapping[str, Any], time_attr: str, metric: str, encoders: Mapping[str, Encoder]
) -> tuple[float, dict[str, float]]:
    values = {metric: _number(result.get(metric))}
    config = _config(result)
    values.update({k: enc(config.get(k)) for k, enc in encoders.items()})
    return float(result[time_attr]), {k: v for k, v in values.items() if v is not None}


def _trace(
    trial_id: str,
    segment: Sequence[Mapping[str, Any]],
    time_attr: str,
    value: Callable[[Mapping[str, Any]], float | None],
) -> Trace:
    pairs = [(float(r[time_attr]), value(r)) for r in segment]
    pairs = [(t, v) for t, v in pairs if v is not None]
    return Trace(trial_id, tuple(t for t, _ in pairs), tuple(v for _, v in pairs))


def _source_result(
    history: Sequence[Mapping[str, Any]], iteration: int, before: Mapping[str, Any] | None
) -> Mapping[str, Any] | None:
    """The source's result an exploit cloned: at ``iteration`` (if that iteration came
    twice, the last before the target's next result, by timestamp)."""
    found = [r for r in history if _iteration(r) == iteration]
    if before is not None and "timestamp" in before:
        earlier = [r for r in found if r.get("timestamp", 0) <= before["timestamp"]]
        found = earlier or found
    return found[-1] if found else None


def _trial_of(tag: str, tags: Mapping[str, str]) -> str | None:
    """The trial an exploit line's tag names: by its tag, else by the index it starts with."""
    return tags.get(tag) or tags.get(str(tag).split("_", 1)[0])


def _stops(results: Sequence[Result], time_attr: str, metric: str) -> tuple[StopMark, ...]:
    """Trials terminated before the furthest time any trial reached, and errored trials."""
    last: dict[str, tuple[float, float | None, TrialStatus]] = {}
    for r in results:
        timed = [h for h in r.history if _number(h.get(time_attr)) is not None]
        if timed:
            h = timed[-1]
            last[r.trial_id] = (float(h[time_attr]), _number(h.get(metric)), TrialStatus(r.status))
    horizon = max((t for t, _, _ in last.values()), default=0.0)
    return tuple(
        StopMark(tid, t, v, status)
        for tid, (t, v, status) in last.items()
        if v is not None and (status == TrialStatus.ERROR or stopped_early(status, t, horizon))
    )


def asha_rungs(state: Mapping[str, Any]) -> tuple[float, ...]:
    """ASHA's milestones (``grace_period · η^k`` up to ``max_t``, every bracket) as its
    committed state holds them; () for other schedulers."""
    brackets = state.get("brackets")
    if not isinstance(brackets, list):
        return ()
    milestones = {
        float(rung[0])
        for b in brackets
        if isinstance(b, dict) and isinstance(b.get("rungs"), list)
        for rung in b["rungs"]
    }
    return tuple(sorted(milestones))


def plot_data(
    snapshot: ExperimentSnapshot,
    time_attr: str = "training_iteration",
    metric: str | None = None,
) -> PlotData:
    """What the figure of ``snapshot`` shows (pure: no storage, no matplotlib).

    ``metric``: the key to plot (default: the experiment's); :class:`NoMetric` if
    there is none.
    """
    metric = metric or snapshot.metric
    if not metric:
        raise NoMetric(
            f"experiment {snapshot.name!r} records no metric to plot: give one "
            "(plot_experiment(metric=...), popflow plot --metric KEY)"
        )
    kind = plot_kind(snapshot.scheduler, snapshot.scheduler_state)
    common = {
        "name": snapshot.name,
        "scheduler": snapshot.scheduler,
        "kind": kind,
        "metric": metric,
        "mode": snapshot.mode,
        "time_attr": time_attr,
        "trials": tuple(r.trial_id for r in snapshot.grid),
        "round": snapshot.round,
        "finished": snapshot.finished,
        **_errors(snapshot),
    }
    if kind == PlotKind.EARLY_STOPPING:
        return PlotData(**common, **_early_stopping(snapshot, time_attr, metric))
    return PlotData(**common, **_population(snapshot, time_attr, metric))


def _errors(snapshot: ExperimentSnapshot) -> dict[str, Any]:
    """How many trials errored, and the last line of the first one's error."""
    errors = [r for r in snapshot.grid if r.status == TrialStatus.ERROR]
    text = next((str(r.error) for r in errors if r.error and str(r.error).strip()), None)
    return {
        "errored": len(errors),
        "first_error": text.strip().splitlines()[-1] if text else None,
    }


def _early_stopping(snapshot: ExperimentSnapshot, time_attr: str, metric: str) -> dict[str, Any]:
    """The metric's traces, the rungs and the stopped trials."""
    results = list(snapshot.grid)
    traces = [
        _trace(r.trial_id, segment, time_attr, lambda h: _number(h.get(metric)))
        for r in results
        for segment in _split(r.history, time_attr, ())[0]
    ]
    stops = _stops(results, time_attr, metric)
    rungs = asha_rungs(snapshot.scheduler_state)
    inferred = not rungs and snapshot.scheduler != "FIFOScheduler"
    if inferred:  # HyperBand, median stopping: where trials stopped (or wait, paused)
        paused = {r.trial_id for r in results if r.status == TrialStatus.PAUSED}
        waits = {s.time for s in stops if s.status == TrialStatus.TERMINATED}
        waits |= {t.times[-1] for t in traces if t.trial_id in paused and t.times}
        rungs = tuple(sorted(waits))
    return {
        "panels": {metric: tuple(t for t in traces if t.times)},
        "categories": {},
        "rungs": rungs,
        "rungs_inferred": inferred and bool(rungs),
        "stops": stops,
        "best": best_trial({r.trial_id: r.history for r in results}, metric, snapshot.mode),
    }


def _population(snapshot: ExperimentSnapshot, time_attr: str, metric: str) -> dict[str, Any]:
    """The traces of the metric and of each mutated key, broken at exploits, and the
    exploits' marks."""
    results, policy = list(snapshot.grid), snapshot.policy
    choices = snapshot.choices or {}
    coding = {
        k: _encoder(results, policy, k, choices.get(k)) for k in mutated_keys(results, policy)
    }
    encoders = {k: enc for k, (enc, _) in coding.items()}
    values: dict[str, Callable[[Mapping[str, Any]], float | None]] = {
        metric: lambda h: _number(h.get(metric))
    }
    for k, enc in encoders.items():
        values[k] = lambda h, k=k, enc=enc: enc(_config(h).get(k))
    by_id = {r.trial_id: r for r in results}
    tags = snapshot.tags or {}
    events = []  # (target, source, entry) of the exploits whose trials are known
    for entry in policy:
        target, source = _trial_of(entry[0], tags), _trial_of(entry[1], tags)
        if target in by_id and source in by_id:
            events.append((target, source, entry))
    panels: dict[str, list[Trace]] = {k: [] for k in values}
    starts: dict[int, Mapping[str, Any] | None] = {}  # event -> the target's next result
    split: dict[str, list[list[Mapping[str, Any]]]] = {}
    into: dict[str, list[tuple[int | None, int]]] = {}  # trial -> (segment after, event)
    for r in results:
        mine = [i for i, (target, _, _) in enumerate(events) if target == r.trial_id]
        segments, after = _split(r.history, time_attr, [int(events[i][2][2]) for i in mine])
        split[r.trial_id] = segments
        for i, seg in zip(mine, after, strict=True):
            starts[i] = segments[seg][0] if seg is not None and segments[seg] else None
            into.setdefault(r.trial_id, []).append((seg, i))
        for segment in (s for s in segments if s):
            for k, value in values.items():
                panels[k].append(_trace(r.trial_id, segment, time_attr, value))
    marks = []
    sources: dict[int, Mapping[str, Any] | None] = {}
    for i, (target, source, entry) in enumerate(events):
        nxt = starts.get(i)
        src = sources[i] = _source_result(by_id[source].history, int(entry[3]), nxt)
        if src is None or _number(src.get(time_attr)) is None:
            continue
        source_at = _point(src, time_attr, metric, encoders)
        if nxt is not None:
            target_at = _point(nxt, time_attr, metric, encoders)
        else:  # the clone has not reported since: the source's state, the new config
            new = flatten(entry[5] or {})
            at = {k: enc(new.get(k)) for k, enc in encoders.items()}
            at[metric] = source_at[1].get(metric)
            target_at = (source_at[0], {k: v for k, v in at.items() if v is not None})
        marks.append(
            ExploitMark(
                target, source, int(entry[2]), int(entry[3]), source_at, target_at, nxt is None
            )
        )
    entries = {  # each exploit into a trial, with the source's result it took
        trial: [Entry(seg, events[i][1], sources.get(i)) for seg, i in found]
        for trial, found in into.items()
    }
    best = best_trial({r.trial_id: r.history for r in results}, metric, snapshot.mode)
    pieces = lineage(best, split, entries) if best is not None else []
    path = {}
    for k, value in values.items():
        parts = [_trace(best or "", piece, time_attr, value) for _, piece in pieces]
        times = tuple(x for p in parts for x in p.times)
        path[k] = Trace(best or "", times, tuple(y for p in parts for y in p.values))
    return {
        "panels": {k: tuple(t for t in v if t.times) for k, v in panels.items()},
        "categories": {k: labels for k, (_, labels) in coding.items() if labels},
        "exploits": tuple(marks),
        "best": best,
        "lineage": {k: t for k, t in path.items() if t.times},
        "lineage_trials": tuple(t for t, _ in pieces),
    }
