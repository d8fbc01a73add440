"""What the driver says happened, as events, and the bus that hands them to subscribers.

The driver (:mod:`popflow.flows.driver.controller`) knows nothing of who follows a run:
the console's table (:mod:`popflow.flows.console`), the Prefect record
(:mod:`popflow.flows.record`) and a simulation's tally subscribe to its
:class:`EventBus` and take the events they care about. Ray's callbacks
(:mod:`popflow.flows.events.callbacks`) are called by the driver directly: their state is
committed with each round, so they are part of the run, not observers of it.

A subscriber is any callable taking one event; it runs in the driver's thread, so it
keeps its work short (the Prefect record queues it). An exception in a subscriber
propagates: a subscriber is the run's own code, not a user's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from popflow.flows.experiment.trial_table import TrialRecord
    from popflow.schedulers import Decision, TrialStatus


@dataclass(frozen=True)
class TrialStarted:
    """The scheduler chose ``record``'s trial to run a segment."""

    record: TrialRecord


@dataclass(frozen=True)
class SegmentReturned:
    """A segment of ``trial_id`` came back (results, or an error), before it is reduced."""

    trial_id: str


@dataclass(frozen=True)
class TrialResult:
    """One result of ``record``'s trial, as the scheduler sees it."""

    record: TrialRecord
    result: dict[str, Any]


@dataclass(frozen=True)
class Decided:
    """The scheduler's ``decision`` on ``trial_id``'s ``result``, as it said it (the exploits
    the driver carried out went out before it as :class:`Exploited`)."""

    trial_id: str
    result: dict[str, Any]
    decision: Decision


@dataclass(frozen=True)
class Exploited:
    """PBT cloned a trial into another: ``brief`` for the commit, ``line`` in Ray's words."""

    target: str
    source: str
    brief: str
    line: str


@dataclass(frozen=True)
class TrialErrored:
    """``record``'s trial errored for good (its retries spent): ``error`` is its trace,
    ``reason`` the trace's last line."""

    record: TrialRecord
    error: str
    reason: str


@dataclass(frozen=True)
class Tick:
    """A moment to refresh what shows time passing: the driver waits for segments, or
    has just reduced some."""

    records: list[TrialRecord]
    rounds: int


@dataclass(frozen=True)
class RoundBegan:
    """Round ``round`` began at ``at`` (the clock's seconds since the epoch). On an object
    store a synchronous round begins before the one before it is committed."""

    round: int
    at: float


@dataclass(frozen=True)
class RoundCommitted:
    """Round ``round`` is committed: ``results`` new results, its ``events`` (``[exploit]
    ...``, ``[error] ...``) and ``decisions`` (exploits in Ray's words); ``counts``: its
    trials by status and ``scheduler`` the scheduler's word on itself, as it ended."""

    round: int
    results: int
    events: list[str] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)
    counts: dict[TrialStatus, int] = field(default_factory=dict)
    scheduler: str = ""


@dataclass(frozen=True)
class RunEnded:
    """The driver's last commit is written: after ``rounds`` rounds, the experiment
    finished, or (``budget_spent``) this run's budget ended it with trials to go."""

    rounds: int
    budget_spent: bool


Event = (
    TrialStarted
    | SegmentReturned
    | TrialResult
    | Decided
    | Exploited
    | TrialErrored
    | Tick
    | RoundBegan
    | RoundCommitted
    | RunEnded
)
Subscriber = Callable[[Event], None]


class EventBus:
    """Hands each event to every subscriber, in the order they subscribed."""

    def __init__(self, *subscribers: Subscriber) -> None:
        self._subscribers: list[Subscriber] = list(subscribers)

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Add ``subscriber``; the function returned removes it."""
        self._subscribers.append(subscriber)
        return lambda: self._subscribers.remove(subscriber)

    def emit(self, event: Event) -> None:
        for subscriber in list(self._subscribers):
            subscriber(event)

    def __bool__(self) -> bool:
        return bool(self._subscribers)
