"""Synchronous HyperBand: the paper's plan, cohort halving, and the exact budget of whole
runs of the real driver on the simulated backend."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from support.simulated import simulated, space_of
from trainables import Objective, objective, trial_index

from popflow.schedulers import (
    Action,
    Decision,
    HyperBandScheduler,
    Trial,
    TrialStatus,
    hyperband_plan,
)
from popflow.schedulers.hyperband import Rung

pytestmark = pytest.mark.unit

# Li et al. 2018, Table 1: R=81, η=3; (n_i, r_i) per bracket, s = 4 .. 0.
PAPER_TABLE_81_3 = [
    [(81, 1), (27, 3), (9, 9), (3, 27), (1, 81)],
    [(34, 3), (11, 9), (3, 27), (1, 81)],
    [(15, 9), (5, 27), (1, 81)],
    [(8, 27), (2, 81)],
    [(5, 81)],
]


def make(**kwargs) -> HyperBandScheduler:
    kwargs.setdefault("metric", "score")
    kwargs.setdefault("mode", "max")
    return HyperBandScheduler(**kwargs)


def res(t, value) -> dict:
    return {"training_iteration": t, "score": value}


# -- plan --------------------------------------------------------------------


def test_plan_matches_the_papers_table():
    plan = hyperband_plan(81, 3)
    assert plan == PAPER_TABLE_81_3
    assert all(isinstance(rung, Rung) for bracket in plan for rung in bracket)
    assert [type(n) for n, _ in plan[1]] == [int] * 4
    # Ray's variant would give 34, 12, 4, 2 in bracket s=3 (ceil(n / η) per rung)
    # and a last milestone below 81 in bracket s=4; we follow the paper.
    assert [n for n, _ in plan[1]] == [34, 11, 3, 1]


def test_plan_other_settings():
    assert hyperband_plan(9, 3) == [[(9, 1), (3, 3), (1, 9)], [(5, 3), (1, 9)], [(3, 9)]]
    assert hyperband_plan(1, 3) == [[(1, 1)]]  # R < η: only the s=0 bracket
    # R not a power of η: s_max = floor(log_η R) = 2 for R=20; r_i may be fractional
    plan = hyperband_plan(20, 3)
    assert [len(b) - 1 for b in plan] == [2, 1, 0]
    assert plan[0] == [(9, 20 / 9), (3, 20 / 3), (1, 20)]
    for bracket in plan:
        assert bracket[-1].r == 20  # every bracket ends at R


def test_plan_uses_exact_arithmetic():
    # R = 3**10, s = 8: (s_max+1)/(s+1) * η**s = 11/9 * 6561 = 8019 exactly, but the
    # float product is 8019.000000000001 and would ceil to 8020
    plan = hyperband_plan(3**10, 3)
    assert plan[2][0] == (8019, 9.0)
    # floor(log_10 1000) = 3 although log(1000)/log(10) = 2.9999999999999996 in floats
    assert len(hyperband_plan(1000, 10)) == 4


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_t": 0}, r"^`max_t` is 0, but must be > 0$"),
        ({"max_t": -3.5}, r"^`max_t` is -3.5, but must be > 0$"),
        ({"reduction_factor": 1}, r"^`reduction_factor` is 1, but must be > 1$"),
        ({"reduction_factor": "3"}, r"^`reduction_factor` is '3', but must be > 1$"),
    ],
)
def test_validation_messages(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HyperBandScheduler(**kwargs)
    args = {"max_t": 81, "reduction_factor": 3, **kwargs}
    with pytest.raises(ValueError, match=match):
        hyperband_plan(args["max_t"], args["reduction_factor"])


def test_mode_validation_message():
    with pytest.raises(ValueError, match=r"^`mode` is 'avg', but must be 'min' or 'max'$"):
        HyperBandScheduler(mode="avg")


def test_metric_and_mode_required_by_first_add():
    with pytest.raises(
        ValueError,
        match=r"^HyperBandScheduler has no `metric` \(None\) or `mode` \('max'\): set them on "
        r"the scheduler, e.g. HyperBandScheduler\(metric=\.\.\., mode=\.\.\.\), or in "
        r"`run\(metric=\.\.\., mode=\.\.\.\)`$",
    ):
        HyperBandScheduler(mode="max").on_trial_add(Trial("a", {}))


def test_ray_defaults():
    s = HyperBandScheduler()
    assert s.synchronous is True
    assert s.time_attr == "training_iteration"
    assert (s.metric, s.mode, s._max_t, s._reduction_factor) == (None, None, 81, 3)
    assert s._stop_last_trials is True
    assert s.plan == PAPER_TABLE_81_3


# -- cohort behaviour --------------------------------------------------------


def small_bracket(**kwargs):
    """max_t=9, η=3: the first bracket is (9 @ 1) -> (3 @ 3) -> (1 @ 9)."""
    s = make(max_t=9, **kwargs)
    trials = [Trial(f"t{i}", {}) for i in range(9)]
    for t in trials:
        s.on_trial_add(t)
    return s, trials


def test_pause_until_cohort_reports_then_release_and_stop():
    s, trials = small_bracket()
    assert [s.next_milestone(t) for t in trials] == [1.0] * 9
    assert s.on_trial_result(trials[0], res(0.5, 100)) == Action.CONTINUE  # before r_0
    for i, t in enumerate(trials[:-1]):
        assert s.on_trial_result(t, res(1, [5, 0, 8, 1, 7, 2, 6, 3][i])) == Action.PAUSE
    last = s.on_trial_result(trials[8], res(1, 4))
    assert isinstance(last, Decision)
    assert last.action == Action.STOP  # 4 is not in the top 3 (8, 7, 6)
    assert dict(last.others) == {
        "t0": Action.STOP,
        "t1": Action.STOP,
        "t2": Action.CONTINUE,
        "t3": Action.STOP,
        "t4": Action.CONTINUE,
        "t5": Action.STOP,
        "t6": Action.CONTINUE,
        "t7": Action.STOP,
    }
    assert s.next_milestone(trials[2]) == 3.0
    assert s.next_milestone(trials[0]) is None
    assert s.num_stopped == 6


def test_reporter_promoted_gets_continue_and_mode_min():
    s, trials = small_bracket(mode="min")
    for i, t in enumerate(trials[:-1]):
        s.on_trial_result(t, res(1, float(i)))
    last = s.on_trial_result(trials[8], res(1, -1.0))
    assert last == Action.CONTINUE  # lowest loss
    assert {k for k, a in last.others.items() if a == Action.CONTINUE} == {"t0", "t1"}


def test_ties_go_to_the_trial_added_first_and_nan_ranks_last():
    s, trials = small_bracket()
    values = [1.0, math.nan, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    for t, v in zip(trials[:-1], values, strict=True):
        s.on_trial_result(t, res(1, v))
    last = s.on_trial_result(trials[8], {"training_iteration": 1})  # no metric: NaN
    kept = {k for k, a in last.others.items() if a == Action.CONTINUE}
    assert kept == {"t0", "t2", "t3"} and last.action == Action.STOP


def test_final_rung_stops_each_trial_or_lets_it_run_on():
    for stop_last in (True, False):
        s, trials = small_bracket(stop_last_trials=stop_last)
        for i, t in enumerate(trials):
            s.on_trial_result(t, res(1, float(i)))
        for t in trials[6:]:
            s.on_trial_result(t, res(3, float(t.trial_id[1:])))
        assert s.next_milestone(trials[8]) == 9.0
        action = s.on_trial_result(trials[8], res(9, 1.0))
        if stop_last:
            assert action == Action.STOP
            assert s.next_milestone(trials[8]) is None
        else:
            assert action == Action.CONTINUE
            assert s.next_milestone(trials[8]) is None
            assert s.on_trial_result(trials[8], res(20, 1.0)) == Action.CONTINUE


def test_missing_time_attr_continues_and_unknown_trials_raise():
    s, trials = small_bracket()
    assert s.on_trial_result(trials[0], {"score": 1.0}) == Action.CONTINUE
    with pytest.raises(KeyError, match="never added"):
        s.on_trial_result(Trial("ghost", {}), res(1, 1.0))


def test_error_of_last_unreported_trial_releases_the_cohort():
    s, trials = small_bracket()
    assert s.release_paused() is None
    for i, t in enumerate(trials[:-1]):
        assert s.on_trial_result(t, res(1, float(i))) == Action.PAUSE
        t.status = TrialStatus.PAUSED
    # waiting trials are never chosen
    trials[8].status = TrialStatus.RUNNING
    assert s.choose_trial_to_run(trials) is None
    s.on_trial_error(trials[8])
    trials[8].status = TrialStatus.ERROR
    released = s.release_paused()
    assert released is not None and released.action == Action.CONTINUE
    assert {k for k, a in released.others.items() if a == Action.CONTINUE} == {"t5", "t6", "t7"}
    assert {k for k, a in released.others.items() if a == Action.STOP} == {
        f"t{i}" for i in range(5)
    }
    assert s.release_paused() is None  # delivered once
    for i in range(5):
        trials[i].status = TrialStatus.TERMINATED
    trials[6].last_train_time = 1.0
    chosen = s.choose_trial_to_run(trials)
    assert chosen is not None and chosen.trial_id in {"t5", "t7"}


def test_completion_releases_the_cohort_and_results_carry_no_stale_actions():
    s, trials = small_bracket()
    for i, t in enumerate(trials[:-1]):
        s.on_trial_result(t, res(1, float(i)))
    s.on_trial_complete(trials[8], res(1, 100.0))  # finished early: leaves the cohort
    released = s.release_paused()
    assert dict(released.others) == {
        **{f"t{i}": Action.STOP for i in range(5)},
        "t5": Action.CONTINUE,
        "t6": Action.CONTINUE,
        "t7": Action.CONTINUE,
    }
    assert s.on_trial_result(trials[7], res(3, 1.0)) == Action.PAUSE
    assert s.on_trial_result(trials[6], res(3, 0.0)) == Action.PAUSE
    assert s.release_paused() is None


def test_choose_prefers_pending_then_promoted_paused():
    s, trials = small_bracket()
    for t in trials[:3]:
        s.on_trial_result(t, res(1, 1.0))
        t.status = TrialStatus.PAUSED
    assert s.choose_trial_to_run(trials) is trials[3]
    for t in trials[3:]:
        t.status = TrialStatus.RUNNING
    assert s.choose_trial_to_run(trials) is None  # paused ones wait for the cohort


def test_new_trials_fill_brackets_biggest_s_first_then_a_new_band():
    s = make()
    trials = [Trial(str(i), {}) for i in range(143 + 90)]
    for t in trials:
        s.on_trial_add(t)
    sizes = [81, 34, 15, 8, 5, 81, 9]
    brackets = [s.bracket_of(t) for t in trials]
    assert [brackets.count(b) for b in range(7)] == sizes
    assert brackets == sorted(brackets)
    assert [s.next_milestone(trials[i]) for i in (0, 81, 115, 130, 138, 143)] == [
        1,
        3,
        9,
        27,
        81,
        1,
    ]


def test_debug_string():
    s, trials = small_bracket()
    for i, t in enumerate(trials):
        s.on_trial_result(t, res(1, float(i)))
    text = s.debug_string()
    assert text.startswith("Using HyperBand: num_stopped=6 total_brackets=1\n")
    assert "Bracket(s=2, rung 1/2: n=3, r=3): members=9 live=3 reported=0 stopped=6" in text


# -- whole runs: the real driver on the simulated backend -----------------------


@dataclass
class Run:
    """What a HyperBand run did: its trials by name (``t000``...), the iterations each
    bracket spent, and per segment (trial, milestone, action, others) as decided at the
    milestone, or "ERROR" where the trial raised on its way there."""

    trials: dict[str, Trial]
    spent: dict[int, float]
    log: list[tuple]

    @property
    def by_id(self) -> dict[str, Trial]:
        return self.trials


def run_hyperband(
    sched: HyperBandScheduler,
    n_trials: int,
    seed: int = 0,
    errors: dict[str, float] | None = None,
    swap_after: int | None = None,
) -> Run:
    """``n_trials`` trials with fixed random configs (by ``seed``) of :func:`objective`,
    trial ``t<i>`` raising at its iteration in ``errors``; segments run one at a time."""
    rng = np.random.default_rng(seed)
    configs = [
        {"a": float(rng.uniform(0, 2)), "b": float(rng.uniform(0, 1)), "c": float(i % 7)}
        for i in range(n_trials)
    ]
    fails = {int(k[1:]): v for k, v in (errors or {}).items()}
    run = simulated(
        type("Objective", (Objective,), {"errors": fails}),
        space_of(configs),
        sched,
        label="t{:03d}",
        swap_after=swap_after,
        fresh=make,
    )
    plan = sched._plan
    spent: dict[int, float] = {}
    log: list[tuple] = []
    for label, _ in run.results:
        bracket = sched.bracket_of(run.trials[label])
        spent[bracket] = spent.get(bracket, 0.0) + 1  # each result is one iteration
    for label, result, decision in run.decisions:
        t = result["training_iteration"]
        if t in {r for _, r in plan[sched.bracket_of(run.trials[label]) % len(plan)]}:
            log.append((label, t, decision.action, sorted(decision.others.items())))
    log += [(label, fails[int(label[1:])], "ERROR", []) for label in run.errored]
    return Run(run.trials, spent, log)


def name(trial: Trial) -> str:
    """A trial's name in a run's log: ``t<index>``, as the runs above label them."""
    return f"t{trial_index(trial.trial_id):03d}"


def expected_run(plan, members: list[Trial], mode: str):
    """Independent successive halving on the fixed objective: (budget, survivors per rung)."""
    sign = 1 if mode == "max" else -1
    alive = list(members)
    budget, survivors, prev_r = 0.0, [], 0.0
    for i, (n, r) in enumerate(plan):
        if i > 0:
            k = min(n, len(alive))
            alive = sorted(alive, key=lambda t: -sign * objective(t.config, prev_r))[:k]
        survivors.append({name(t) for t in alive})
        budget += len(alive) * (r - prev_r)
        prev_r = r
    return budget, survivors


@pytest.mark.parametrize("mode", ["max", "min"])
def test_a_run_spends_exactly_the_planned_budget(mode):
    sched = make(mode=mode)
    backend = run_hyperband(sched, 143)
    plan = hyperband_plan(81, 3)
    for b, bracket in enumerate(plan):
        planned = sum(n * (r - (bracket[i - 1].r if i else 0)) for i, (n, r) in enumerate(bracket))
        assert backend.spent[b] == planned  # e.g. s=4: 81*1 + 27*2 + 9*6 + 3*18 + 1*54
        members = [t for t in backend.trials.values() if sched.bracket_of(t) == b]
        assert len(members) == bracket[0].n
        budget, survivors = expected_run(bracket, members, mode)
        assert budget == planned
        reached = [
            {
                tid
                for tid, t, _, _ in backend.log
                if t == r and sched.bracket_of(backend.by_id[tid]) == b
            }
            for _, r in bracket
        ]
        assert reached == survivors
    assert all(t.status == TrialStatus.TERMINATED for t in backend.trials.values())
    assert sched.num_stopped == 143


def test_a_partial_second_band():
    sched = make()
    backend = run_hyperband(sched, 143 + 20, seed=5)
    members = [t for t in backend.trials.values() if sched.bracket_of(t) == 5]
    assert len(members) == 20
    budget, survivors = expected_run(hyperband_plan(81, 3)[0], members, "max")
    assert backend.spent[5] == budget == 20 * 1 + 20 * 2 + 9 * 6 + 3 * 18 + 1 * 54
    assert {
        tid for tid, t, _, _ in backend.log if t == 81 and tid in {name(m) for m in members}
    } == (survivors[-1])


def test_state_round_trip_gives_identical_decisions():
    """After ``split`` results (mid-round too), the driver's scheduler is replaced by a
    fresh one restored from a JSON round trip of its state: the run goes on the same."""
    reference = run_hyperband(make(), 143 + 10, seed=2)
    results = sum(reference.spent.values())
    for split in (1, 60, 150, 220, 1400):
        backend = run_hyperband(make(), 143 + 10, seed=2, swap_after=split)
        assert results > split
        assert backend.log == reference.log
        assert backend.spent == reference.spent


def test_errors_and_early_completion_never_hang_a_cohort():
    plan = hyperband_plan(81, 3)
    sched = make()
    # t000..t080 form bracket s=4; the best few error at various rungs
    probe = run_hyperband(make(), 143)
    finalists = [tid for tid, t, a, _ in probe.log if t == 27 and tid < "t081"]
    errors = {finalists[0]: 27.0, "t000": 1.0, "t001": 1.0}
    backend = run_hyperband(sched, 143, errors=errors)
    statuses = (TrialStatus.TERMINATED, TrialStatus.ERROR)
    assert all(t.status in statuses for t in backend.trials.values())
    errored = {tid for tid, t in backend.trials.items() if t.status == TrialStatus.ERROR}
    assert errored == set(errors)
    for b, bracket in enumerate(plan):
        planned = sum(n * (r - (bracket[i - 1].r if i else 0)) for i, (n, r) in enumerate(bracket))
        assert backend.spent[b] <= planned
    reached_r = [
        {tid for tid, t, a, _ in backend.log if t == r and tid < "t081" and a != "ERROR"}
        for _, r in plan[0]
    ]
    assert [len(x) for x in reached_r] == [79, 27, 9, 2, 1]  # the errored finalist is missing


def test_set_state_rejects_another_plan():
    s, _ = small_bracket()
    with pytest.raises(ValueError, match="same max_t and reduction_factor"):
        make(max_t=81).set_state(s.get_state())
