"""Decision parity with Ray Tune's ASHA and median stopping rule (issue 3).

Random result streams (a few trials, their results interleaved, times
increasing per trial, random scores) are fed to popflow's scheduler and to
Ray Tune's, the Ray object driven directly with stub trials and a stub
controller (no ``ray.init``), following the controller's protocol:

- every trial is added first (``on_trial_add``, status PENDING);
- each result goes to ``on_trial_result`` unless it is flagged as meeting a
  stop condition, in which case only ``on_trial_complete`` sees it (as in
  both controllers);
- STOP ends the trial (``on_trial_complete`` with that result), PAUSE marks
  it PAUSED until its next result, a trial whose results run out completes;
- now and then a PENDING or PAUSED trial is removed (``on_trial_remove``).

At the first disagreement a stream is abandoned (the two states differ from
then on) and the disagreement is classified. Stream classes are reported
separately:

- ``unit``: finite scores (often tied), time steps of 1;
- ``sparse``: finite scores, time steps of 1 to 12 (floats too), but no "gap":
  no decision sees another trial at or past ``t`` with no result in
  ``[grace_period, t]`` (an undefined running mean for the median rule);
- ``gaps``: as sparse, with at least one such gap;
- ``nan``: as sparse (no gaps), some scores NaN (popflow's median rule documents
  NaN handling as a deliberate difference);
- ``inf``: as sparse (no gaps), some scores +-inf;
- ``missing``: as sparse (no gaps), some results without the metric (documented
  for the median rule: Ray raises on them).

Schedulers: ``AsyncHyperBandScheduler(brackets=1)`` with random grace period,
max_t, reduction factor, stop_last_trials and mode; ``MedianStoppingRule``
with random grace period, min_samples_required, min_time_slice, hard_stop, mode.

    .venv/bin/python benchmarks/ray_parity.py                 # 2,000 streams per class
    .venv/bin/python benchmarks/ray_parity.py --quick         # 200 per class
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from common import table, write_json

from popflow.schedulers import AsyncHyperBandScheduler, MedianStoppingRule, Trial, TrialStatus

TIME, METRIC = "t", "m"
CLASSES = ("unit", "sparse", "gaps", "nan", "inf", "missing")


# -- stubs for Ray's side --------------------------------------------------------------------
class StubTrial:
    """What Ray's schedulers read from a trial: trial_id, status; hashable by identity."""

    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id
        self.status = "PENDING"

    def __repr__(self) -> str:
        return f"StubTrial({self.trial_id})"


class StubController:
    """What Ray's MedianStoppingRule calls on the controller: ``get_live_trials()``."""

    def __init__(self, trials: list[StubTrial]) -> None:
        self.trials = trials

    def get_live_trials(self) -> list[StubTrial]:
        return [t for t in self.trials if t.status not in ("TERMINATED", "ERROR")]


# -- streams ---------------------------------------------------------------------------------
@dataclass
class Event:
    trial: int
    result: dict[str, Any]
    terminal: bool = False  # a stop condition fired: on_trial_complete only
    remove_after: bool = False  # afterwards, remove some PENDING/PAUSED trial


@dataclass
class Stream:
    kind: str
    n_trials: int
    events: list[Event] = field(default_factory=list)


def _score(rng: np.random.Generator, kind: str) -> float | None:
    r = rng.random()
    if kind == "nan" and r < 0.15:
        return math.nan
    if kind == "inf" and r < 0.1:
        return math.inf if rng.random() < 0.5 else -math.inf
    if kind == "missing" and r < 0.1:
        return None
    if rng.random() < 0.5:  # ties are where off-by-one comparisons show
        return float(rng.integers(0, 6))
    return float(rng.normal(0, 1))


def make_stream(rng: np.random.Generator, kind: str) -> Stream:
    n_trials = int(rng.integers(2, 7))
    order: list[int] = []
    per_trial: list[list[dict[str, Any]]] = []
    for i in range(n_trials):
        length = int(rng.integers(1, 26))
        t: float = 0
        results = []
        for k in range(length):
            if kind == "unit":
                t += 1
            elif rng.random() < 0.3:
                t += float(np.round(rng.uniform(0.1, 6), 2))
            else:
                t += int(rng.integers(1, 13))
            result: dict[str, Any] = {TIME: t, "training_iteration": k + 1}
            value = _score(rng, kind)
            if value is not None:
                result[METRIC] = value
            results.append(result)
        per_trial.append(results)
        order += [i] * length
    order = [int(i) for i in rng.permutation(order)]
    cursor = [0] * n_trials
    stream = Stream(kind, n_trials)
    for i in order:
        result = per_trial[i][cursor[i]]
        cursor[i] += 1
        last = cursor[i] == len(per_trial[i])
        stream.events.append(
            Event(
                trial=i,
                result=result,
                terminal=last and rng.random() < 0.3,
                remove_after=rng.random() < 0.03,
            )
        )
    return stream


# -- scheduler pairs -------------------------------------------------------------------------
@dataclass
class Pair:
    popflow: Any
    ray: Any
    params: dict[str, Any]


def asha_pair(rng: np.random.Generator) -> Pair:
    from ray.tune.schedulers import AsyncHyperBandScheduler as RayASHA

    grace = [1, 2, 3, 5, 0.5, 2.5][int(rng.integers(6))]
    params = {
        "time_attr": TIME,
        "metric": METRIC,
        "mode": "max" if rng.random() < 0.5 else "min",
        "grace_period": grace,
        "max_t": grace * [1, 2, 4, 9, 16, 30, 100][int(rng.integers(7))],
        "reduction_factor": [2, 3, 4, 2.5][int(rng.integers(4))],
        "brackets": 1,
        "stop_last_trials": bool(rng.random() < 0.7),
    }
    return Pair(
        AsyncHyperBandScheduler(**params, rng=np.random.default_rng(0)), RayASHA(**params), params
    )


def median_pair(rng: np.random.Generator) -> Pair:
    from ray.tune.schedulers import MedianStoppingRule as RayMedian

    params = {
        "time_attr": TIME,
        "metric": METRIC,
        "mode": "max" if rng.random() < 0.5 else "min",
        "grace_period": [0, 1, 3, 5, 2.5, 10][int(rng.integers(6))],
        "min_samples_required": int(rng.integers(1, 5)),
        "min_time_slice": [0, 0, 1, 2.5, 5][int(rng.integers(5))],
        "hard_stop": bool(rng.random() < 0.7),
    }
    return Pair(MedianStoppingRule(**params), RayMedian(**params), params)


# -- driving ---------------------------------------------------------------------------------
@dataclass
class Outcome:
    decisions: int = 0
    disagreement: dict[str, Any] | None = None
    popflow_s: float = 0.0
    ray_s: float = 0.0


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def drive(pair: Pair, stream: Stream, seed: int) -> Outcome:
    """Feed ``stream`` to both schedulers; stop at the first disagreement."""
    np.random.seed(seed)  # Ray's ASHA draws its bracket from the global generator
    ids = [f"t{i}" for i in range(stream.n_trials)]
    ours = [Trial(tid, {}) for tid in ids]
    theirs = [StubTrial(tid) for tid in ids]
    ctrl = StubController(theirs)
    out = Outcome()
    last: dict[int, dict[str, Any]] = {}

    def set_status(i: int, status: TrialStatus) -> None:
        ours[i].status = status
        theirs[i].status = status.value

    def both(name: str, i: int, *extra: Any) -> tuple[Any, Any]:
        a, da = _timed(lambda: getattr(pair.popflow, name)(ours[i], *extra))
        b, db = _timed(lambda: getattr(pair.ray, name)(ctrl, theirs[i], *extra))
        out.popflow_s += da
        out.ray_s += db
        return a, b

    for i in range(stream.n_trials):
        both("on_trial_add", i)
    for k, event in enumerate(stream.events):
        i = event.trial
        if ours[i].status == TrialStatus.TERMINATED:
            continue  # stopped or removed: its later results never happen
        set_status(i, TrialStatus.RUNNING)
        result = dict(event.result)
        last[i] = result
        ours[i].last_result = result
        if event.terminal:
            try:
                both("on_trial_complete", i, result)
            except Exception as exc:  # e.g. Ray's median rule on a result without the metric
                out.disagreement = {"event": k, "error": f"{type(exc).__name__}: {exc}"}
                return out
            set_status(i, TrialStatus.TERMINATED)
        else:
            try:
                a, b = both("on_trial_result", i, result)
            except Exception as exc:
                out.disagreement = {"event": k, "error": f"{type(exc).__name__}: {exc}"}
                return out
            out.decisions += 1
            a = str(getattr(a, "action", a))
            if a != str(b):
                out.disagreement = {"event": k, "trial": ids[i], "popflow": a, "ray": str(b)}
                return out
            if a == "STOP":
                both("on_trial_complete", i, result)
                set_status(i, TrialStatus.TERMINATED)
            elif a == "PAUSE":
                set_status(i, TrialStatus.PAUSED)
        if event.remove_after:
            waiting = [j for j, t in enumerate(ours) if t.status in ("PENDING", "PAUSED")]
            if waiting:
                j = waiting[int(np.random.default_rng(seed + k).integers(len(waiting)))]
                both("on_trial_remove", j)
                set_status(j, TrialStatus.TERMINATED)
        # a trial whose results ran out completes
        if ours[i].status != TrialStatus.TERMINATED and all(
            e.trial != i for e in stream.events[k + 1 :]
        ):
            both("on_trial_complete", i, result)
            set_status(i, TrialStatus.TERMINATED)
    return out


def _empty_window_before(stream: Stream, grace: float, last_event: int) -> bool:
    """Did any decision up to ``last_event`` see another trial at or past ``t`` that had
    no result in ``[grace_period, t]`` (an undefined running mean)?"""
    hist: dict[int, list[float]] = {}
    for e in stream.events[: last_event + 1]:
        t = e.result[TIME]
        if t >= grace:
            for j, times in hist.items():
                if j != e.trial and times[-1] >= t and not any(grace <= x <= t for x in times):
                    return True
        hist.setdefault(e.trial, []).append(t)
    return False


def classify(stream: Stream, pair: Pair, outcome: Outcome) -> str:
    """A likely cause for a disagreement (first match)."""
    d = outcome.disagreement or {}
    seen = [e.result for e in stream.events[: d.get("event", 0) + 1]]
    if "error" in d:
        return "exception: " + d["error"].split(":")[0]
    scores = [r[METRIC] for r in seen if METRIC in r]
    if any(isinstance(x, float) and math.isnan(x) for x in scores):
        return "NaN score seen"
    if any(isinstance(x, float) and math.isinf(x) for x in scores):
        return "inf score seen"
    if len(scores) < len(seen):
        return "result without metric seen"
    if "min_samples_required" in pair.params and _empty_window_before(
        stream, pair.params["grace_period"], d["event"]
    ):
        return "another trial had no result in [grace_period, t] at a decision"
    return "unexplained"


def _stream_for(rng: np.random.Generator, kind: str, grace: float) -> Stream:
    """A stream of ``kind``. Only "gaps" streams have a gap (a decision that sees another
    trial with an empty ``[grace_period, t]`` window), so every other class isolates
    its own cause."""
    base = "sparse" if kind == "gaps" else kind
    while True:
        stream = make_stream(rng, base)
        if kind == "unit":
            return stream  # steps of 1: no gap after grace_period
        gap = _empty_window_before(stream, grace, len(stream.events) - 1)
        if gap == (kind == "gaps"):
            return stream


def run_class(
    name: str, make_pair: Callable[[np.random.Generator], Pair], kind: str, n: int, seed: int
) -> dict[str, Any]:
    rng = np.random.default_rng([seed, CLASSES.index(kind), 0 if name == "asha" else 1])
    causes: Counter[str] = Counter()
    examples: list[dict[str, Any]] = []
    decisions = streams_bad = 0
    pop_s = ray_s = 0.0
    for k in range(n):
        pair = make_pair(rng)
        stream = _stream_for(rng, kind, pair.params["grace_period"])
        outcome = drive(pair, stream, seed=seed * 100_000 + k)
        decisions += outcome.decisions
        pop_s += outcome.popflow_s
        ray_s += outcome.ray_s
        if outcome.disagreement is not None:
            streams_bad += 1
            cause = classify(stream, pair, outcome)
            causes[cause] += 1
            if len(examples) < 3:
                examples.append(
                    {"cause": cause, "params": pair.params, **outcome.disagreement, "stream": k}
                )
    return {
        "scheduler": name,
        "class": kind,
        "streams": n,
        "decisions_compared": decisions,
        "streams_disagreeing": streams_bad,
        "causes": dict(causes),
        "examples": examples,
        "popflow_call_s": pop_s,
        "ray_call_s": ray_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="200 streams per class")
    parser.add_argument("--streams", type=int, default=2000, help="streams per class")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    n = 200 if args.quick else args.streams
    warnings.filterwarnings("ignore", category=RuntimeWarning)  # nanpercentile of all-NaN

    rows, runs = [], []
    for name, make_pair in (("asha", asha_pair), ("median", median_pair)):
        for kind in CLASSES:
            run = run_class(name, make_pair, kind, n, args.seed)
            runs.append(run)
            causes = "; ".join(f"{c}: {k}" for c, k in sorted(run["causes"].items())) or "-"
            rows.append(
                [
                    name,
                    kind,
                    run["streams"],
                    run["decisions_compared"],
                    run["streams_disagreeing"],
                    run["popflow_call_s"],
                    run["ray_call_s"],
                    causes,
                ]
            )
            print(f"  {name}/{kind}: {run['streams_disagreeing']} disagreeing streams", flush=True)
    print(
        table(
            [
                "scheduler",
                "class",
                "streams",
                "decisions",
                "disagreeing streams",
                "popflow s",
                "ray s",
                "causes",
            ],
            rows,
        )
    )
    core = [r for r in runs if r["class"] in ("unit", "sparse")]  # finite scores, no gaps
    core_bad = sum(r["streams_disagreeing"] for r in core)
    print(
        f"finite scores without gaps (unit, sparse): {core_bad} disagreeing streams of "
        f"{sum(r['streams'] for r in core)} (target 0)"
    )
    for run in runs:
        for ex in run["examples"][:1]:
            print(f"  e.g. {run['scheduler']}/{run['class']}: {ex}")
    path = write_json(
        "ray_parity",
        {
            "quick": args.quick,
            "streams_per_class": n,
            "runs": runs,
            "finite_classes_disagreeing_streams": core_bad,
            "target_met": core_bad == 0,
        },
    )
    print(f"figures written to {path}")


if __name__ == "__main__":
    sys.exit(main())
