"""When a run ends before its trials do: ``fail_fast``, Ray's stoppers and
``time_budget_s``, and popflow's budget of one run (``run_budget_s``, ``max_rounds``).

A stopper passed as ``stop`` sees every result on the driver (it may end
that trial there), and its ``stop_all()`` may end the whole experiment; with
``fail_fast`` the first trial error does. The controller asks :meth:`EarlyEnd.stops`
per result and :meth:`EarlyEnd.errored` per trial error, and ends every
live trial once :attr:`EarlyEnd.due`. The stopper's state is committed
(:meth:`EarlyEnd.state`), so a resumed run stops where an uninterrupted one would.

Ray's ``time_budget_s`` ends the experiment, as Ray's ``TimeoutStopper`` does: every
segment is sent with the deadline (:attr:`EarlyEnd.end_by`) and ends at its first report
past it, so a trial that never reaches a decision point (a function reporting for ever)
ends on time; the driver wakes at the deadline (:meth:`EarlyEnd.wake_at`), takes what the
segments in flight report within :data:`GRACE_S`, and ends every live trial TERMINATED.
A restore then runs nothing more (Ray's too). A run resumed after a crash gets the whole
budget again (Ray's restores what its stopper had left).

popflow's budget of one run is different: it ends the *run*, not the experiment. Once
:meth:`EarlyEnd.over_budget` (``run_budget_s`` seconds, or ``max_rounds``
rounds of this run), segments in flight are cancelled, their trials wait as
they were last committed, and the experiment stays resumable (the next
``resume="auto"`` run, a scheduled deployment's, goes on from there). Segments are sent
with ``run_budget_s``'s end too, so one that never reaches a decision point frees its
slot; the driver takes what they report and save up to their end (within
:data:`GRACE_S`) before it cancels the rest, so a segment longer than the budget (a
function under FIFO) still makes progress run after run. A segment ended there ends the
run, not the trial (:attr:`EarlyEnd.cut_short`).
A stop asked from outside the driver (:class:`StopAsked`: a cancel in Prefect's UI,
seen by the record's thread) ends the run the same way, at the next look at the budget.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from popflow.flows.driver.clock import Clock, SystemClock
from popflow.flows.experiment.trial_table import TrialRecord
from popflow.schedulers.stoppers import Stopper

if TYPE_CHECKING:
    from popflow.flows.spec.run_spec import RunSpec

#: Seconds the driver waits, after ``time_budget_s``, for the segments in flight to end at
#: their next report (a segment that reports no more by then is cancelled, its trial
#: ended as last committed).
GRACE_S = 10.0


class StopAsked:
    """A stop of the run asked from another thread (a cancel from Prefect): the driver
    ends as at its budget. ``why`` says who asked; ``honoured`` that the run ended by it."""

    def __init__(self) -> None:
        self.why: str | None = None
        self.honoured = False

    def ask(self, why: str) -> None:
        if self.why is None:  # the first asker is the one the run's end names
            self.why = why


class EarlyEnd:
    def __init__(self, spec: RunSpec, resumed: dict[str, Any], clock: Clock | None = None) -> None:
        self.clock = clock or SystemClock()
        self.fail_fast = spec.fail_fast
        #: Ray's ``Stopper`` passed as ``stop`` (None: none, or a dict or function,
        #: which the workers apply)
        self.stopper = spec.stop if isinstance(spec.stop, Stopper) else None
        if self.stopper is not None and resumed.get("stopper") is not None:
            self.stopper.set_state(resumed["stopper"])
        #: the trial whose error ended the experiment (``fail_fast``)
        self.failed: TrialRecord | None = None
        self._stop_all = False
        self.time_budget_s = spec.time_budget_s  # Ray's: the experiment's
        self.run_budget_s = spec.run_budget_s  # popflow's: this run's
        self.max_rounds = spec.max_rounds
        self._started = self.clock.monotonic()
        self._started_at = self.clock.time()
        self._timed_out = False
        self._cut_short = False  # a segment ended at the run budget's end (the worker's clock)
        self._rounds = 0  # rounds this run has finished
        self._spent = False
        #: a stop asked from outside (the door sets it: the Prefect record's)
        self.asked = StopAsked()

    @property
    def due(self) -> bool:
        """The experiment is to end now."""
        return self.failed is not None or self._stop_all or self.timed_out()

    @property
    def why(self) -> str:
        if self.failed is not None:
            return f"fail_fast: trial {self.failed.trial_id} errored"
        if self._timed_out:
            return f"time_budget_s={self.time_budget_s:g} reached"
        return f"{type(self.stopper).__name__}.stop_all()"

    def timed_out(self) -> bool:
        """Ray's ``time_budget_s`` has passed: the experiment ends (and stays so)."""
        if not self._timed_out and self.time_budget_s is not None:
            # as wake_at() adds it: a clock moved on to that very moment has reached it
            self._timed_out = self.clock.monotonic() >= self._started + self.time_budget_s
        return self._timed_out

    @property
    def end_by(self) -> float | None:
        """When the first of ``time_budget_s`` and ``run_budget_s`` ends, in seconds since
        the epoch (what segments are sent with: they end at their first report past it,
        and a function reporting for ever frees its slot); None: no such budget."""
        budgets = [b for b in (self.time_budget_s, self.run_budget_s) if b is not None]
        return self._started_at + min(budgets) if budgets else None

    @property
    def run_budget_first(self) -> bool:
        """``run_budget_s`` ends before ``time_budget_s``: a segment ended at
        :attr:`end_by` ended this run, not the experiment."""
        if self.run_budget_s is None:
            return False
        return self.time_budget_s is None or self.run_budget_s < self.time_budget_s

    def reached_by_worker(self) -> None:
        """A segment ended at ``run_budget_s``'s end (a worker's clock got there first):
        the run is over its budget, whatever the driver's clock says."""
        self._cut_short = True

    @property
    def cut_short(self) -> bool:
        """A segment ended at ``run_budget_s``'s end: the run ends now, mid-round."""
        return self._cut_short

    def wake_at(self) -> float | None:
        """When (the clock's monotonic seconds) a driver waiting for segments must look
        again: the first of the budgets' ends not yet reached; None: none."""
        ends = [
            self._started + budget
            for budget, spent in (
                (self.time_budget_s, self._timed_out),
                (self.run_budget_s, self._spent),
            )
            if budget is not None and not spent
        ]
        return min(ends, default=None)

    def stops(self, trial_id: str, result: dict[str, Any]) -> bool:
        """Whether the stopper ends this trial at ``result`` (as a stop condition)."""
        if self.stopper is None:
            return False
        stop = self.stopper(trial_id, result)
        self.check()
        return bool(stop)

    def check(self) -> None:
        """Ask the stopper's ``stop_all`` (per result, and once a round: a timeout that
        no result checks)."""
        if self.stopper is not None and not self._stop_all and self.stopper.stop_all():
            self._stop_all = True

    def round_done(self) -> None:
        self._rounds += 1

    def over_budget(self) -> bool:
        """This run has used its ``run_budget_s`` or its ``max_rounds``, or was asked
        to stop."""
        if self.asked.why is not None or self._cut_short:
            return True
        if self.max_rounds is not None and self._rounds >= self.max_rounds:
            return True
        if self.run_budget_s is None:
            return False
        return self.clock.monotonic() >= self._started + self.run_budget_s

    def run_budget_reached(self) -> bool:
        """``run_budget_s``, ending before ``time_budget_s``, has passed by the driver's clock
        or a worker's, and no stop was asked from outside: the segments in flight, sent with
        its end, end at their next report."""
        if self.asked.why is not None or not self.run_budget_first:
            return False
        assert self.run_budget_s is not None  # run_budget_first
        return self._cut_short or self.clock.monotonic() >= self._started + self.run_budget_s

    @property
    def budget(self) -> str:
        """The budget that ended the run, in words."""
        if self.asked.why is not None:
            return self.asked.why
        if self.max_rounds is not None and self._rounds >= self.max_rounds:
            return f"max_rounds={self.max_rounds}"
        return f"run_budget_s={self.run_budget_s:g}"

    def end_of_budget(self) -> None:
        """The run ends here, at its budget, with work left."""
        self._spent = True
        self.asked.honoured = self.asked.why is not None

    @property
    def ended_by(self) -> str:
        """What ended the run with work left, in words: the budget spent, or the stop asked."""
        return self.budget if self.asked.honoured else f"{self.budget} spent"

    @property
    def spent(self) -> bool:
        """The run ended at its budget, with work left."""
        return self._spent

    def errored(self, rec: TrialRecord) -> None:
        """``rec`` errored for good: with ``fail_fast``, the first one ends the run."""
        if self.fail_fast and self.failed is None:
            self.failed = rec

    def state(self) -> dict[str, Any] | None:
        """The stopper's state, for the commit."""
        return self.stopper.get_state() if self.stopper is not None else None
