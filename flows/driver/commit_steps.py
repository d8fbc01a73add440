"""The commit step of the driver's round (:class:`~popflow.flows.driver.controller.Controller`
inherits it): the round's state built into a commit, written once the checkpoints it
names are stored, or held to be written while the next round's first segments train
(:mod:`popflow.flows.driver.pipelined_commit`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from popflow.flows.driver.pipelined_commit import PreparedCommit
from popflow.flows.driver.retention import retire_checkpoints
from popflow.flows.events.run_events import RoundCommitted
from popflow.flows.experiment import round_history
from popflow.flows.experiment.round_history import extend
from popflow.infra.store.json_delta import Changed
from popflow.infra.store.layout import checkpoint_path

if TYPE_CHECKING:
    from popflow.flows.driver.controller import Controller


class RoundCommits:
    """Commit steps, on the controller's state."""

    def commit(self: Controller, final: bool = False, hold: bool = False) -> None:
        """Write this round's logs, then publish the commit, then delete what the
        commit before retired. ``hold``: build it now, write it while the next round's
        first segments train (:mod:`popflow.flows.driver.pipelined_commit`).

        First the lease: a driver that a newer one has taken over raises
        :class:`~popflow.infra.store.lease.LeaseLost` here and writes nothing more.
        """
        self._write_prepared()
        self.check_lease()
        results, policy = self.logs.end_round(self.log.seq + 1)
        retired = retire_checkpoints(self.records, self.spec.checkpoint_config)
        for dirname, _ in retired:
            self.index.touch(self.by_dir[dirname])
        changed = self.index.take_changed()
        trials = (
            [r.state() for r in self.records]
            if changed is None
            else Changed({pos: self.records[pos].state() for pos in sorted(changed)})
        )
        derived, logs_through = self.logs.settle(final)
        now = self.clock.time()
        self.history = extend(self.history, self.log.epoch, self.rounds, self.began, now)
        prepared = PreparedCommit.of(
            hold,
            {
                "round": self.rounds,
                "time": now,
                "began": self.began,
                round_history.KEY: self.history,
                "trials": trials,
                "scheduler": self.scheduler.get_state(),
                "decisions": self.decisions,
                "derived": derived,
                "events": self.notes,
                "deleted": [checkpoint_path(d, name) for d, name in retired],
                "cuts": self.logs.take_cuts(),
                "results": results,
                "policy": policy,
                "policy_total": self.logs.policy_total,
                "stopper": self.early_end.state(),
                "callbacks": self.hooks.state(),
                **(
                    {}
                    if self.suggestions is None
                    else {
                        "search": self.suggestions.state(),
                        "search_calls": self.suggestions.calls,
                    }
                ),
            },
            round=self.rounds,
            logs_through=logs_through,
            final=final,
            retired=retired,
            results=sum(map(len, results.values())),
            notes=self.notes,
            decisions=self._decisions,
            counts=self.index.counts(),
            scheduler=self.scheduler.debug_string(),
        )
        self.notes, self._decisions = [], []
        if hold:
            self.prepared = prepared
        else:
            self._write(prepared)

    def _write(self: Controller, prepared: PreparedCommit) -> None:
        """Publish a prepared commit once the checkpoints it names are stored."""
        self.publishing.settle(self.backend, prepared.round, prepared)
        self.check_lease()
        self.log.commit(prepared.payload, logs_through=prepared.logs_through)
        self.logs.committed(prepared.final)
        self.janitor.committed(prepared.retired, wait=prepared.final)
        self.events.emit(
            RoundCommitted(
                prepared.round,
                prepared.results,
                prepared.notes,
                prepared.decisions,
                prepared.counts,
                prepared.scheduler,
            )
        )

    def _write_prepared(self: Controller) -> None:
        """Write the last round's commit (held while this round's first segments train)."""
        if self.prepared is not None:
            prepared, self.prepared = self.prepared, None
            self._write(prepared)

    def _retiring(self: Controller, dirname: str) -> frozenset[str]:
        """Checkpoints of ``dirname`` the commit still to write retires."""
        if self.prepared is None:
            return frozenset()
        return frozenset(name for d, name in self.prepared.retired if d == dirname)
