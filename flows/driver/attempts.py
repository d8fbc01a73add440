"""Segment attempts: which names a trial's next segment may publish under.

Within one driver epoch a trial's segment may be dispatched again while an earlier
dispatch of it could still publish: a worker the scheduler declared dead (SIGSTOPped,
cut off) wakes and publishes what it trained. Its names would be the new dispatch's
names, and publishes are create-only
(:func:`~popflow.infra.store.checkpoints.publish_checkpoint`): so a dispatch that follows
one whose end the driver did not see in full gets a new attempt number, which its
checkpoint names carry (:func:`~popflow.infra.store.layout.checkpoint_name`). A trial whose
segments all return keeps its attempt, and a run with no re-dispatch Ray's plain names.

A segment "returned" when its own worker answered with its outcome and no error: every
checkpoint it published is in that outcome, so the driver knows the names (the trial's
``taken``). Anything else (a lost or restarted worker, a call that failed or was
cancelled, a segment that errored, publishes a lost round never settled) leaves the
trial's dispatch open, and its next one starts a new attempt. Memory only: a new epoch
has names of its own anyway.
"""

from __future__ import annotations

from popflow.tasks.specs import EndReason, SegmentOutcome


class Attempts:
    """Each trial's segment attempt in this driver epoch (1 until a re-dispatch)."""

    def __init__(self) -> None:
        self._attempt: dict[str, int] = {}
        self._dispatched: set[str] = set()
        self._open: set[str] = set()  # dispatched, and not seen to return (see the module)

    def dispatch(self, trial_id: str) -> int:
        """The attempt of a segment of ``trial_id`` being dispatched now."""
        attempt = self._attempt.get(trial_id, 1)
        if trial_id in self._open:  # an earlier dispatch may still publish
            attempt += 1
            self._attempt[trial_id] = attempt
        self._open.add(trial_id)
        self._dispatched.add(trial_id)
        return attempt

    def returned(self, outcome: SegmentOutcome) -> None:
        """``outcome`` came back; its trial's dispatch is closed if its worker answered
        with no error (every name it published is in it)."""
        if outcome.reason != EndReason.ERROR and not outcome.lost_worker:
            self._open.discard(outcome.trial_id)

    def reopen_all(self) -> None:
        """Every trial dispatched so far may still publish (a lost round: its publishes
        were never settled)."""
        self._open.update(self._dispatched)

    def of(self, trial_id: str) -> int:
        return self._attempt.get(trial_id, 1)
