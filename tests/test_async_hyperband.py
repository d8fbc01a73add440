"""ASHA: validation, Ray's rung semantics, an independent oracle, state round trip."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.examples import examples

from popflow.schedulers import Action, ASHAScheduler, AsyncHyperBandScheduler, Decision, Trial
from popflow.schedulers.async_hyperband import rung_milestones

pytestmark = pytest.mark.unit

NAN = math.nan


def make(**kwargs) -> AsyncHyperBandScheduler:
    kwargs.setdefault("metric", "score")
    kwargs.setdefault("mode", "max")
    kwargs.setdefault("rng", np.random.default_rng(0))
    return AsyncHyperBandScheduler(**kwargs)


def res(t, value) -> dict:
    return {"training_iteration": t, "score": value}


# -- arguments ---------------------------------------------------------------


def test_ray_defaults():
    s = ASHAScheduler()
    assert ASHAScheduler is AsyncHyperBandScheduler
    assert s.time_attr == "training_iteration"
    assert (s.metric, s.mode) == (None, None)
    assert (s._max_t, s._grace_period, s._reduction_factor) == (100, 1, 4)
    assert len(s._brackets) == 1 and s._stop_last_trials is True
    assert s.synchronous is False
    assert s.milestones(0) == [1, 4, 16, 64]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_t": 0}, r"^`max_t` is 0, but must be > 0$"),
        ({"max_t": -5}, r"^`max_t` is -5, but must be > 0$"),
        ({"grace_period": 0}, r"^`grace_period` is 0, but must be > 0$"),
        ({"grace_period": -1.5}, r"^`grace_period` is -1.5, but must be > 0$"),
        ({"grace_period": 200}, r"^`grace_period` is 200, but must be <= `max_t` \(100\)$"),
        ({"reduction_factor": 1}, r"^`reduction_factor` is 1, but must be > 1$"),
        ({"reduction_factor": 0.5}, r"^`reduction_factor` is 0.5, but must be > 1$"),
        ({"reduction_factor": "4"}, r"^`reduction_factor` is '4', but must be a number > 1$"),
        ({"brackets": 0}, r"^`brackets` is 0, but must be between 1 and 1,000 \(with max_t"),
        ({"brackets": 1.5}, r"^`brackets` is 1.5, but must be an integer between 1 and 1,000$"),
        ({"mode": "avg"}, r"^`mode` is 'avg', but must be 'min' or 'max'$"),
    ],
)
def test_validation_messages(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AsyncHyperBandScheduler(**kwargs)


@pytest.mark.parametrize(("metric", "mode"), [(None, None), ("score", None), (None, "max")])
def test_metric_and_mode_required_by_first_add(metric, mode):
    s = AsyncHyperBandScheduler(metric=metric, mode=mode)
    with pytest.raises(
        ValueError,
        match=r"^AsyncHyperBandScheduler has no `metric` .* or `mode` .*: set them on the "
        r"scheduler, e.g. AsyncHyperBandScheduler\(metric=\.\.\., mode=\.\.\.\), or in "
        r"`run\(metric=\.\.\., mode=\.\.\.\)`$",
    ):
        s.on_trial_add(Trial("a", {}))


def test_metric_and_mode_from_tune():
    s = AsyncHyperBandScheduler()
    assert s.set_search_properties("score", "min") is True
    assert s.set_search_properties("other", "max") is False
    s.on_trial_add(Trial("a", {}))
    assert s.on_trial_result(Trial("a", {}), res(1, 3.0)) == Action.CONTINUE


# -- rungs -------------------------------------------------------------------


def test_rungs_follow_rays_expression_largest_first():
    assert rung_milestones(1, 100, 4, 0) == [64, 16, 4, 1]
    assert rung_milestones(1, 100, 4, 1) == [64, 16, 4]
    assert rung_milestones(1, 100, 4, 2) == [64, 16]
    assert rung_milestones(1, 10, 2, 0) == [8, 4, 2, 1]
    assert rung_milestones(5, 100, 3, 0) == [45, 15, 5]
    assert rung_milestones(1, 3, 4, 1) == []  # a bracket may have no rung at all
    s = make(brackets=3, max_t=81, grace_period=1, reduction_factor=3)
    assert [s.milestones(b) for b in range(3)] == [[1, 3, 9, 27, 81], [3, 9, 27, 81], [9, 27, 81]]


def test_rays_bracket_docstring_example():
    # Ray's _Bracket(1, 10, 2, 0) example: cutoffs 3.0 then 2.0 at the first rung.
    s = make(max_t=10, grace_period=1, reduction_factor=2)
    t1, t2, t3 = (Trial(f"t{i}", {}) for i in (1, 2, 3))
    for t in (t1, t2, t3):
        s.on_trial_add(t)
    assert s.on_trial_result(t1, res(1, 2)) == Action.CONTINUE
    assert s.on_trial_result(t2, res(1, 4)) == Action.CONTINUE
    assert s.on_trial_result(t3, res(1, 1)) == Action.STOP
    rung1 = dict(s._brackets[0].rungs)[1]
    assert rung1 == {"t1": 2.0, "t2": 4.0, "t3": 1.0}  # recorded although stopped


def test_percentile_cutoff_and_equal_score_continues():
    s = make(max_t=100, grace_period=1, reduction_factor=4)
    trials = [Trial(str(i), {}) for i in range(6)]
    for t in trials:
        s.on_trial_add(t)
    for i, t in enumerate(trials[:4]):
        s.on_trial_result(t, res(1, float(i)))
    # 75th percentile of [0, 1, 2, 3] is 2.25
    assert s.on_trial_result(trials[4], res(1, 2.25)) == Action.CONTINUE
    assert s.on_trial_result(trials[5], res(1, 2.2)) == Action.STOP


def test_mode_min_negates():
    s = make(mode="min", max_t=10, grace_period=1, reduction_factor=2)
    a, b = Trial("a", {}), Trial("b", {})
    s.on_trial_add(a)
    s.on_trial_add(b)
    assert s.on_trial_result(a, res(1, 0.1)) == Action.CONTINUE
    assert s.on_trial_result(b, res(1, 0.5)) == Action.STOP  # higher loss is worse


def test_only_highest_unrecorded_rung_per_result_and_skipped_rung_later():
    # Rungs 1, 2, 4, 8 (largest first). A trial jumping to t=5 is judged at rung 4
    # only; Ray then judges it at the skipped rung 2 on its next result.
    s = make(max_t=10, grace_period=1, reduction_factor=2)
    a, b = Trial("a", {}), Trial("b", {})
    s.on_trial_add(a)
    s.on_trial_add(b)
    for t in (1, 2, 4):
        assert s.on_trial_result(a, res(t, 10.0)) == Action.CONTINUE
    assert s.on_trial_result(b, res(5, 11.0)) == Action.CONTINUE
    rungs = dict(s._brackets[0].rungs)
    assert "b" in rungs[4] and "b" not in rungs[2] and "b" not in rungs[1]
    assert s.on_trial_result(b, res(6, 1.0)) == Action.STOP  # judged at rung 2 now
    assert rungs[2]["b"] == 1.0 and "b" not in rungs[1]


def test_stop_last_trials_false_skips_lower_rungs_once_promoted():
    s = make(max_t=10, grace_period=1, reduction_factor=2, stop_last_trials=False)
    a, b = Trial("a", {}), Trial("b", {})
    s.on_trial_add(a)
    s.on_trial_add(b)
    s.on_trial_result(a, res(4, 10.0))
    assert s.on_trial_result(b, res(5, 11.0)) == Action.CONTINUE
    # b is recorded at rung 4, so the break skips the unrecorded rungs 2 and 1
    assert s.on_trial_result(b, res(6, -100.0)) == Action.CONTINUE
    assert s.on_trial_result(b, res(10, -100.0)) == Action.CONTINUE  # past max_t: runs on
    assert s.on_trial_result(b, res(12, -100.0)) == Action.CONTINUE
    assert s.next_milestone(b) is None


def test_max_t_stops_without_recording():
    s = make(max_t=10, grace_period=1, reduction_factor=2)
    a = Trial("a", {})
    s.on_trial_add(a)
    assert s.on_trial_result(a, res(10, 100.0)) == Action.STOP
    assert all("a" not in rec for _, rec in s._brackets[0].rungs)


def test_missing_time_attr_or_metric_continues():
    s = make(max_t=10, grace_period=1, reduction_factor=2)
    a, b = Trial("a", {}), Trial("b", {})
    s.on_trial_add(a)
    s.on_trial_add(b)
    s.on_trial_result(a, res(1, 10.0))
    assert s.on_trial_result(b, {"training_iteration": 1}) == Action.CONTINUE
    assert s.on_trial_result(b, {"score": -5.0}) == Action.CONTINUE
    assert s.on_trial_result(b, res(1, None)) == Action.CONTINUE
    assert s.on_trial_result(b, res(100, None)) == Action.CONTINUE
    assert s.on_trial_result(b, res(1, -5.0)) == Action.STOP


def test_nan_scores_never_stop_and_are_ignored_by_the_cutoff():
    s = make(max_t=10, grace_period=1, reduction_factor=2)
    trials = [Trial(str(i), {}) for i in range(4)]
    for t in trials:
        s.on_trial_add(t)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no All-NaN RuntimeWarning either
        assert s.on_trial_result(trials[0], res(1, NAN)) == Action.CONTINUE
        assert s.on_trial_result(trials[1], res(1, NAN)) == Action.CONTINUE  # NaN cutoff
        assert s.on_trial_result(trials[2], res(1, 5.0)) == Action.CONTINUE
        assert s.on_trial_result(trials[3], res(1, 4.0)) == Action.STOP  # cutoff 5 (NaN ignored)


def test_on_trial_complete_records_final_result():
    s = make(max_t=10, grace_period=1, reduction_factor=2)
    a, b = Trial("a", {}), Trial("b", {})
    s.on_trial_add(a)
    s.on_trial_add(b)
    s.on_trial_complete(a, res(2, 10.0))
    assert dict(s._brackets[0].rungs)[2] == {"a": 10.0}
    assert s.bracket_of(a) is None
    with pytest.raises(KeyError, match="never added or has already completed"):
        s.on_trial_result(a, res(3, 1.0))
    s.on_trial_result(b, res(1, 0.0))
    assert s.on_trial_result(b, res(2, 9.0)) == Action.STOP


def test_next_milestone():
    s = make(max_t=100, grace_period=2, reduction_factor=3, brackets=2, rng=None)
    a = Trial("a", {})
    s.on_trial_add(a)
    ms = s.milestones(s.bracket_of(a))
    assert s.next_milestone(a) == ms[0]
    s.on_trial_result(a, res(ms[0], 1.0))
    assert s.next_milestone(a) == ms[1]
    s.on_trial_result(a, res(ms[1] + 1, 1.0))
    assert s.next_milestone(a) == ms[2]
    s.on_trial_result(a, res(ms[-1], 1.0))
    assert s.next_milestone(a) == 100  # past the last rung: run to max_t
    # the controller's view counts too
    b = Trial("b", {}, last_result={"training_iteration": 50})
    s.on_trial_add(b)
    assert s.next_milestone(b) == min([m for m in s.milestones(s.bracket_of(b)) if m > 50] + [100])


def test_debug_string_reports_stops_per_bracket():
    s = make(max_t=10, grace_period=1, reduction_factor=2, brackets=2)
    trials = [Trial(str(i), {}) for i in range(20)]
    for t in trials:
        s.on_trial_add(t)
    for i, t in enumerate(trials):
        s.on_trial_result(t, res(2, float(-i)))
    per_bracket = [b.num_stopped for b in s._brackets]
    assert sum(per_bracket) == s._num_stopped > 0
    text = s.debug_string()
    assert text.startswith(f"Using AsyncHyperBand: num_stopped={s._num_stopped}\n")
    for k, n in enumerate(per_bracket):
        assert f"Bracket s={k}: num_stopped={n} |" in text


def test_bracket_assignment_uses_only_the_injected_generator():
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    a = make(brackets=3, max_t=81, reduction_factor=3, rng=np.random.default_rng(7))
    b = make(brackets=3, max_t=81, reduction_factor=3, rng=np.random.default_rng(7))
    trials = [Trial(str(i), {}) for i in range(200)]
    for t in trials:
        a.on_trial_add(t)
        b.on_trial_add(t)
    assert [a.bracket_of(t) for t in trials] == [b.bracket_of(t) for t in trials]
    assert (np.random.get_state()[1] == before).all()
    counts = np.bincount([a.bracket_of(t) for t in trials], minlength=3)
    # softmax over rung counts 5, 4, 3: p = 0.665, 0.245, 0.090
    assert counts[0] > counts[1] > counts[2] > 0


# -- oracle ------------------------------------------------------------------


class ReferenceASHA:
    """The rung rule written from its description, with plain loops."""

    def __init__(self, max_t, grace, rf, brackets, stop_last, mode, rng):
        self.max_t, self.rf, self.stop_last, self.mode, self.rng = max_t, rf, stop_last, mode, rng
        self.brackets = []
        for s in range(brackets):
            count = int(np.log(max_t / grace) / np.log(rf) - s + 1)
            milestones = [grace * rf ** (k + s) for k in range(max(count, 0))]
            self.brackets.append([(m, {}) for m in sorted(milestones, reverse=True)])
        self.where = {}

    def add(self, tid):
        sizes = np.array([len(b) for b in self.brackets])
        p = np.e ** (sizes - sizes.max())
        self.where[tid] = int(self.rng.choice(len(self.brackets), p=p / p.sum()))

    def _judge(self, tid, t, value):
        x = value if self.mode == "max" else -value
        for milestone, recorded in self.brackets[self.where[tid]]:
            if t < milestone:
                continue
            if tid in recorded:
                if not self.stop_last:
                    return Action.CONTINUE
                continue
            stop = False
            if recorded:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    cutoff = np.nanpercentile(list(recorded.values()), (1 - 1 / self.rf) * 100)
                stop = x < cutoff
            recorded[tid] = x
            return Action.STOP if stop else Action.CONTINUE
        return Action.CONTINUE

    def result(self, tid, t, value):
        if t is None or value is None:
            return Action.CONTINUE
        if t >= self.max_t and self.stop_last:
            return Action.STOP
        return self._judge(tid, t, value)

    def complete(self, tid, t, value):
        if t is not None and value is not None:
            self._judge(tid, t, value)


def random_stream(seed: int, length: int, n_trials: int) -> list[tuple]:
    """(trial, time increment, score, kind) events; scores tie often, include NaN and None."""
    g = np.random.default_rng(seed)
    out = []
    for _ in range(length):
        pick = int(g.integers(10))
        if pick < 6:
            value = float(g.integers(-4, 5))  # many ties
        elif pick == 6:
            value = NAN
        elif pick == 7:
            value = None  # metric missing
        else:
            value = float(g.normal() * 1e3)
        kind = ["result"] * 8 + ["complete", "no_time"]
        out.append((int(g.integers(n_trials)), int(g.integers(5)), value, kind[g.integers(10)]))
    return out


@st.composite
def asha_cases(draw):
    # Hypothesis draws the shape; a numpy stream from a drawn seed keeps each
    # example cheap enough to run thousands.
    grace = draw(st.integers(1, 3))
    length = draw(st.integers(1, 60))
    return {
        "mode": draw(st.sampled_from(["min", "max"])),
        "brackets": draw(st.sampled_from([1, 3])),
        "rf": draw(st.sampled_from([2, 3, 4, 2.5])),
        "grace": grace,
        "max_t": draw(st.integers(grace, 40)),
        "stop_last": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**32 - 1)),
        "events": random_stream(draw(st.integers(0, 2**32 - 1)), length, draw(st.integers(2, 6))),
        "split": draw(st.integers(0, length)),
    }


@settings(
    max_examples=examples(3000),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(asha_cases())
def test_matches_reference_on_random_streams(case):
    def build(seed):
        return AsyncHyperBandScheduler(
            metric="score",
            mode=case["mode"],
            max_t=case["max_t"],
            grace_period=case["grace"],
            reduction_factor=case["rf"],
            brackets=case["brackets"],
            stop_last_trials=case["stop_last"],
            rng=np.random.default_rng(seed),
        )

    sched = build(case["seed"])
    ref = ReferenceASHA(
        case["max_t"],
        case["grace"],
        case["rf"],
        case["brackets"],
        case["stop_last"],
        case["mode"],
        np.random.default_rng(case["seed"]),
    )
    trials, now, done = {}, {}, set()
    for k, (i, dt, value, kind) in enumerate(case["events"]):
        if k == case["split"]:
            # resume from JSON into a fresh object whose own generator differs
            state = json.loads(json.dumps(sched.get_state()))
            sched = build(case["seed"] + 1)
            sched.set_state(state)
        tid = f"t{i}"
        if tid in done:
            continue
        if tid not in trials:
            trials[tid] = Trial(tid, {})
            sched.on_trial_add(trials[tid])
            ref.add(tid)
            assert sched.bracket_of(trials[tid]) == ref.where[tid]
            now[tid] = 0
        now[tid] += dt
        t = None if kind == "no_time" else now[tid]
        result = {"score": value} if value is not None else {}
        if t is not None:
            result["training_iteration"] = t
        if kind == "complete":
            sched.on_trial_complete(trials[tid], result)
            ref.complete(tid, t, value)
            done.add(tid)
            continue
        got = sched.on_trial_result(trials[tid], result)
        assert isinstance(got, Action)
        assert got == ref.result(tid, t, value), (k, tid, t, value)
        if got == Action.STOP:
            done.add(tid)
        else:
            ms = sorted(m for m, _ in ref.brackets[ref.where[tid]])
            if t is not None and value is not None and t >= case["max_t"]:
                assert sched.next_milestone(trials[tid]) is None
            elif t is not None and value is not None:
                assert sched.next_milestone(trials[tid]) == min(
                    [m for m in ms if m > t] + [case["max_t"]]
                )


def test_state_round_trip_gives_identical_decisions():
    rng = np.random.default_rng(3)
    stream = [(int(rng.integers(12)), float(rng.normal())) for _ in range(400)]
    stream[5] = (stream[5][0], NAN)

    def build(seed):
        return make(
            brackets=3,
            max_t=64,
            grace_period=1,
            reduction_factor=2,
            rng=np.random.default_rng(seed),
        )

    def run(split):
        s = build(1)
        trials: dict[int, Trial] = {}
        now: dict[int, int] = {}
        stopped: set[int] = set()
        out = []
        for k, (i, value) in enumerate(stream):
            if k == split:
                text = json.dumps(s.get_state())
                assert ("NaN" in text) == (split > 5)
                s = build(99)
                s.set_state(json.loads(text))
                assert json.dumps(s.get_state(), sort_keys=True) == json.dumps(
                    json.loads(text), sort_keys=True
                )
            if i in stopped:
                continue
            if i not in trials:  # added lazily: the generator state must survive too
                trials[i] = Trial(str(i), {})
                s.on_trial_add(trials[i])
                now[i] = 0
            now[i] += 1
            action = Decision.of(s.on_trial_result(trials[i], res(now[i], value))).action
            out.append((i, action, s.next_milestone(trials[i])))
            if action == Action.STOP:
                stopped.add(i)
        return out, [s.bracket_of(t) for t in trials.values()], s.debug_string()

    full = run(split=-1)
    assert any(a == Action.STOP for _, a, _ in full[0])
    for split in (3, 40, 200):
        assert run(split) == full


def test_set_state_rejects_other_rungs():
    state = make(max_t=81, reduction_factor=3).get_state()
    with pytest.raises(ValueError, match="different brackets/rungs"):
        make(max_t=81, reduction_factor=4).set_state(state)


def test_re_adding_a_trial_keeps_its_bracket_and_draws_nothing():
    s = make(brackets=3, max_t=81, reduction_factor=3, rng=np.random.default_rng(4))
    a = Trial("a", {})
    s.on_trial_add(a)
    before = json.dumps(s.get_state())
    s.on_trial_add(a)
    assert json.dumps(s.get_state()) == before


def test_numpy_scalars_in_results_keep_state_json_serialisable():
    s = make(max_t=10, grace_period=1, reduction_factor=2)
    a = Trial("a", {})
    s.on_trial_add(a)
    s.on_trial_result(a, {"training_iteration": np.int64(2), "score": np.float32(0.5)})
    state = json.loads(json.dumps(s.get_state()))
    assert state["last_time"] == {"a": 2}
    assert dict(state["brackets"][0]["rungs"])[2] == {"a": 0.5}
