"""The plan and dispatch steps of the driver's round
(:class:`~popflow.flows.driver.controller.Controller` inherits them): the scheduler picks
the trials to run and how far each goes, new trials come from the search algorithm, and
each pack of segments goes to a runner (before the last round's publishes are settled
where it restores nothing still publishing:
:func:`~popflow.flows.driver.pipelined_commit.split_pending`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from popflow.flows.driver.clock import SystemClock
from popflow.flows.driver.packing import pack_size
from popflow.flows.driver.pipelined_commit import split_pending
from popflow.flows.driver.segment_cuts import Cut, cut
from popflow.flows.driver.trial_index import started
from popflow.flows.events.run_events import TrialStarted
from popflow.flows.experiment.new_trials import trial_id_of
from popflow.flows.experiment.results import latest_checkpoint
from popflow.flows.experiment.trial_table import TrialRecord, restore_digest
from popflow.flows.spec.config import placement_of
from popflow.infra.store.layout import ERROR_FILE
from popflow.schedulers import Trial, TrialStatus
from popflow.schedulers.resource_changing import ResourceChangingScheduler
from popflow.tasks.seeding import segment_seed
from popflow.tasks.specs import SegmentSpec

if TYPE_CHECKING:
    from popflow.flows.driver.backend import Placement
    from popflow.flows.driver.controller import Controller


class RoundDispatch:
    """Plan and dispatch steps, on the controller's state."""

    # -- plan ------------------------------------------------------------------
    def _runnable(self: Controller) -> Sequence[Trial]:
        """Trials the scheduler may choose now (not those waiting out a retry backoff;
        with ``max_concurrent_trials``, Ray's cap on trials started and not ended)."""
        return self.index.runnable(self.retries.ready, self.spec.max_concurrent_trials)

    def _suggest(self: Controller) -> None:
        """New trials from the run's search algorithm, while it has room for them."""
        if self.suggestions is not None:
            self.suggestions.fill(self.backend.slots, lambda n: trial_id_of(self.spec.name, n))

    def _add_trial(self: Controller, rec: TrialRecord) -> None:
        """A trial the search algorithm suggested joins the run."""
        if rec.dirname in self.by_dir:
            raise ValueError(f"`trial_dirname_creator` gave two trials the folder {rec.dirname!r}")
        self.records.append(rec)
        self.by_id[rec.trial_id] = rec
        self.by_dir[rec.dirname] = rec
        self._attach(rec)
        self.index.add(rec)
        self.table.trials[rec.trial_id] = rec.trial
        self.scheduler.on_trial_add(rec.trial)

    def _attach(self: Controller, rec: TrialRecord) -> None:
        """What callbacks read of ``rec``'s trial beyond its record (Ray's ``Trial.path``,
        ``checkpoint``, ``error_file``, ``placement_group_factory``); the driver keeps
        them current as they change."""
        t = rec.trial
        t.path = self.storage.full_url(rec.dirname)
        t.checkpoint = latest_checkpoint(self.storage, rec)
        failed = t.status == TrialStatus.ERROR
        t.error_file = self.storage.full_url(rec.dirname, ERROR_FILE) if failed else None
        t.placement_group_factory = self._resources(rec)["resources"]

    def _plan(self: Controller, limit: int | None) -> list[TrialRecord]:
        """Mark the trials the scheduler picks as running, up to ``limit`` in flight."""
        self._suggest()
        planned: list[TrialRecord] = []
        room = None if limit is None else limit - self.backend.running
        if room is not None and room <= 0:
            return planned
        for chosen in self.scheduler.choose_trials_to_run(self._runnable(), room):
            rec = self.by_id[chosen.trial_id]
            if not started(rec):
                self.logs.add_params(rec)
            if self.suggestions is not None:
                self.suggestions.started(rec.trial_id)
            self._clock += 1
            rec.trial.status = TrialStatus.RUNNING
            rec.trial.last_train_time = self._clock
            self.hooks.trial_start(rec.trial)
            self.events.emit(TrialStarted(rec))
            planned.append(rec)
        return planned

    def _taken(self: Controller, rec: TrialRecord) -> frozenset[str]:
        """Checkpoint names ``rec``'s next segment may not use."""
        return (
            frozenset(c.name for c in rec.checkpoints)
            | self.janitor.deleting(rec.dirname)
            | self._retiring(rec.dirname)
        )

    def _spec(self: Controller, rec: TrialRecord) -> SegmentSpec:
        if rec.rebuild is not None:
            return self._rebuild_spec(rec)
        target = self.scheduler.next_milestone(rec.trial)
        freq = self.spec.checkpoint_config.checkpoint_frequency
        stopper = self.early_end.stopper
        cuts = cut(target, freq, stopper is not None, self.hooks.see_each_result)
        if isinstance(self.scheduler, ResourceChangingScheduler) and self.scheduler.each_result:
            cuts = Cut(1, True)  # in iterations, whatever the base's time (PBT's seconds)
        save_first, rec.save_first = rec.save_first, None  # asked for once
        return SegmentSpec(
            trainable=self.spec.trainable,
            trial_id=rec.trial_id,
            trial_dir=rec.dirname,
            trial_name=str(rec.trial),
            experiment_name=self.spec.name,
            config=rec.trial.config,
            storage=self.storage,
            seed=segment_seed(self.seed, rec.index, rec.start_iteration, rec.generation),
            restore=rec.restore,
            restore_digest=restore_digest(self.by_dir, rec.restore),
            time_attr=self.scheduler.time_attr,
            target=target,
            max_iterations=cuts.max_iterations,
            save_at_decisions=cuts.save_at_decisions,
            save_first=save_first,
            stop=None if stopper is not None else self.spec.stop,
            checkpoint_frequency=freq,
            checkpoint_at_end=self.spec.checkpoint_at_end,
            taken=self._taken(rec),
            live_token=rec.live[0] if rec.live else None,
            lease_epoch=self.lease.epoch if self.lease is not None else 0,
            attempt=self.attempts.dispatch(rec.trial_id),
            progress_topic=self.progress_topic,
            log_to_file=self.spec.run_config.log_to_file,
            defer_publish=self._pipelining,
            end_by=self._end_by,
            **self._resources(rec),
        )

    def _resources(self: Controller, rec: TrialRecord) -> dict[str, Any]:
        """What ``rec``'s next segment holds: the run's resources, or what a
        :class:`ResourceChangingScheduler` gave it (its slot sized so)."""
        if isinstance(self.scheduler, ResourceChangingScheduler):
            held = self.scheduler.trial_resources(rec.trial_id)
            rec.trial.placement_group_factory = held
            return {"resources": held, "slot_resources": held.dask_resources()}
        held = placement_of(self.spec.trainable, self.spec.resources)
        rec.trial.placement_group_factory = held
        return {"resources": held}

    @property
    def _end_by(self: Controller) -> float | None:
        """The run's time budget's end, which segments end at (seconds since the epoch,
        as the workers' clocks read it: none on a simulation's virtual clock)."""
        return self.early_end.end_by if isinstance(self.clock, SystemClock) else None

    def _rebuild_spec(self: Controller, rec: TrialRecord) -> SegmentSpec:
        """The segment that makes again the state ``rec``'s exploit cloned
        (:class:`~popflow.flows.experiment.trial_table.Rebuild`): the source's training
        from its earlier state to the exploit's iteration, with its config and its
        segments' seed, saved in ``rec``'s folder; nothing else (no stop condition, no
        other checkpoint, no progress shown, published before it returns)."""
        r = rec.rebuild
        assert r is not None
        self.discard_live(rec)  # its trainable holds no state of the rebuild's
        rec.rebuilding = True
        return SegmentSpec(
            trainable=self.spec.trainable,
            trial_id=rec.trial_id,
            trial_dir=rec.dirname,
            trial_name=str(rec.trial),
            experiment_name=self.spec.name,
            config=r.config,
            storage=self.storage,
            seed=segment_seed(self.seed, r.index, r.iteration, r.generation),
            restore=r.restore,
            restore_digest=restore_digest(self.by_dir, r.restore),
            max_iterations=r.through - r.iteration,
            checkpoint_at_end=False,
            taken=self._taken(rec),
            lease_epoch=self.lease.epoch if self.lease is not None else 0,
            attempt=self.attempts.dispatch(rec.trial_id),
        )

    @property
    def _pipelining(self: Controller) -> bool:
        return self.pipelined and self.rounds > self.pipeline_after

    def _pack_size(self: Controller, slots: int) -> int:
        return pack_size(self.backend.segment_seconds, self.index.live, slots)

    # -- dispatch --------------------------------------------------------------
    def _place(self: Controller, recs: list[TrialRecord]) -> Placement | None:
        # a synchronous round waits for its slowest slot: a pack that would queue behind
        # another on its trainables' worker goes to an idle runner (a worker that joined,
        # say) if their checkpoints hold their state; asynchronous PBT time-shares slots
        idle_first = self.scheduler.synchronous or self.scheduler.time_shares_slots
        return self.backend.place(recs, idle_first=idle_first)

    def _dispatch(
        self: Controller, recs: list[TrialRecord], placement: Placement | None = None
    ) -> None:
        if placement is None:
            placement = self._place(recs)
        worker = placement.worker if placement is not None else None
        for rec in recs:
            if rec.live is not None and rec.live[1] != worker:
                self.discard_live(rec)  # it restores from its checkpoint there
        self.backend.submit(recs, [self._spec(r) for r in recs], placement)

    def _dispatch_now(
        self: Controller, pack: list[TrialRecord]
    ) -> tuple[list[TrialRecord], Placement | None] | None:
        """Send what of ``pack`` may start before the last round's publishes are settled;
        the rest and where it goes (:func:`split_pending`), to send after them."""
        if not self.publishing:
            self._dispatch(pack)
            return None
        placement = self._place(pack)
        worker = placement.worker if placement is not None else None
        now, later = split_pending(pack, worker, self.publishing)
        if now:
            self._dispatch(now, placement)
        return (later, placement if now else None) if later else None
