"""The trial table: the driver's book on each trial, and how a scheduler's decisions change it.

:class:`TrialRecord` is what a commit stores about one trial.
:class:`TrialTable` applies decisions to the trials' statuses and calls the
scheduler's follow-up hooks (``on_trial_remove``, ``on_trial_complete``,
``release_paused``). It touches no storage and no cluster: the controller
owns this one rule on every backend, and passes in what an exploit means
(it points the target at the source's checkpoint).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from popflow.infra.jsonutil import jsonable
from popflow.infra.store.layout import checkpoint_path
from popflow.schedulers import Action, Decision, Exploit, Trial, TrialScheduler, TrialStatus
from popflow.tasks.specs import CheckpointRecord

logger = logging.getLogger(__name__)


def is_finished(commit: dict[str, Any]) -> bool:
    """The experiment ``commit`` leaves is over: its search algorithm (if any) adds no more
    trials, and every trial of its table ended (none pending, running or paused). With a
    search algorithm the table starts empty (the first commit has no trial), so an
    empty or ended table alone says nothing."""
    live = (TrialStatus.PENDING, TrialStatus.RUNNING, TrialStatus.PAUSED)
    ended = not any(TrialStatus(t["status"]) in live for t in commit["trials"])
    return ended and not search_goes_on(commit)


def search_goes_on(commit: dict[str, Any]) -> bool:
    """``commit``'s search algorithm may still add trials (False without one)."""
    search = commit.get("search")
    if not isinstance(search, dict):
        return False
    if "more" in search:
        return bool(search["more"])
    # older commits lack "more": a searcher that said FINISHED has none, and one that
    # suggested nothing yet has not begun (the commit before the first round)
    return not search.get("finished", False) and not search.get("created", 0)


@dataclass
class LineageStart:
    """Where a trial's current lineage began: the checkpoint its newest exploit cloned
    (``restore``: its source's, or its own for an exploit of itself), at ``iteration``,
    when ``results`` of its own results were logged; ``exploit``: how many exploits the
    trial has had, that one included. A checkpoint the trial wrote since is newer state
    of this lineage; one it wrote before is another lineage (other state, other config),
    never a fallback (:func:`~popflow.flows.experiment.fallback.fall_back_from`)."""

    restore: str
    iteration: int
    results: int | None
    exploit: int

    def state(self) -> dict[str, Any]:
        return {
            "restore": self.restore,
            "iteration": self.iteration,
            "results": self.results,
            "exploit": self.exploit,
        }


@dataclass
class Rebuild:
    """The state a trial's exploit cloned, made again: that checkpoint failed its check
    before the trial trained on from it, and no other copy of that state exists. A segment
    restores the exploit source's newest earlier state on its lineage (``restore``, at
    ``iteration``; None: from the start) and trains on to ``through`` (the exploit's
    iteration) as the source did: with its ``config`` and the seeds of its segments
    (``index``, ``generation``: :func:`~popflow.tasks.seeding.segment_seed`), its results
    not logged; the checkpoint it saves there is the trial's lineage start, from which it
    goes on with the config the exploit chose, as after any exploit. ``source``: the folder
    of the trial whose checkpoint was damaged, ``lineage``: how many exploits it had had
    when it wrote it (where to look again if ``restore`` is damaged too)."""

    source: str
    lineage: int | None
    through: int
    config: dict[str, Any]
    index: int
    generation: int
    restore: str | None
    iteration: int

    def state(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "lineage": self.lineage,
            "through": self.through,
            "config": self.config,
            "index": self.index,
            "generation": self.generation,
            "restore": self.restore,
            "iteration": self.iteration,
        }


@dataclass
class TrialRecord:
    """The driver's book on one trial; ``state()`` is what a commit stores."""

    trial: Trial
    index: int
    dirname: str
    restore: str | None = None  # checkpoint folder (relative to the experiment) to resume from
    restore_iteration: int = 0
    #: how many of this trial's logged results the state it restores from accounts for
    #: (None: all of them, as in commits written before it was kept); a segment built
    #: from that state supersedes the results logged after them
    restore_results: int | None = 0
    #: the trial was sent back to an earlier state: its results up to this iteration
    #: are run again, and logged, but not decided on again (the scheduler and the
    #: stoppers saw them the first time); 0: none
    replay_through: int = 0
    checkpoints: list[CheckpointRecord] = field(default_factory=list)
    #: results committed so far; the results themselves are in storage (``result.json``)
    #: and the latest in ``trial.last_result``: a long run's history stays out of memory
    num_results: int = 0
    num_failures: int = 0
    error: str | None = None
    lineage: list[list[Any]] = field(default_factory=list)  # PBT policy entries
    generation: int = 0  # how often another trial's state was cloned into this one
    #: where its lineage began (its newest exploit); None: never exploited
    start: LineageStart | None = None
    #: the state its newest exploit cloned, to be made again before it trains on (that
    #: checkpoint was found damaged first); None: none pending
    rebuild: Rebuild | None = None
    csv_header: list[str] | None = None
    #: the config it started with (Ray's ``params.json``) once an exploit changed it;
    #: None: ``trial.config`` (commits written before it was kept lack it)
    first_config: dict[str, Any] | None = None
    #: (token, worker address) of the trainable parked on a worker; memory only,
    #: never committed: a lost live trainable just means a restore from storage
    live: tuple[str, str] | None = None
    #: the result a driver-side callback asked to checkpoint (``should_checkpoint``) that
    #: has none yet: its segment had ended; the next segment saves it first. Memory only
    save_first: dict[str, Any] | None = None
    #: its segment in flight is a :class:`Rebuild`'s (results not its own). Memory only
    rebuilding: bool = False

    @property
    def trial_id(self) -> str:
        return self.trial.trial_id

    @property
    def exploits(self) -> int:
        """How many exploits the trial has had (itself or another trial as the source)."""
        return self.start.exploit if self.start is not None else 0

    @property
    def start_iteration(self) -> int:
        """The iteration the trial's next segment starts after."""
        if self.live is not None:
            return int(self.trial.last_result.get("training_iteration", self.restore_iteration))
        return self.restore_iteration

    @property
    def movable(self) -> bool:
        """Its next segment may run on any worker: no trainable is parked, or the parked
        one's state is in its latest checkpoint (else only that worker has it)."""
        return self.live is None or self.restore_iteration >= self.start_iteration

    @property
    def params(self) -> dict[str, Any]:
        """The config it started with: its ``params.json`` (Ray's), whatever exploits
        changed since."""
        return self.trial.config if self.first_config is None else self.first_config

    def checkpoint_path(self, name: str) -> str:
        return checkpoint_path(self.dirname, name)

    def replay_after_rewind(self) -> None:
        """Its next results follow ``restore``'s state: those up to the iteration it had
        reached are a replay (see ``replay_through``)."""
        if self.restore_results is not None and self.num_results > self.restore_results:
            reached = self.trial.last_result.get("training_iteration")
            if isinstance(reached, int):
                self.replay_through = max(self.replay_through, reached)

    def replays(self, result: dict[str, Any]) -> bool:
        """``result`` runs again an iteration the scheduler decided on (once past the
        replay, none does)."""
        iteration = result.get("training_iteration")
        if isinstance(iteration, int) and iteration <= self.replay_through:
            return True
        self.replay_through = 0
        return False

    def restore_from(
        self, checkpoints: list[CheckpointRecord], results: list[dict[str, Any]]
    ) -> None:
        """A segment that logs ``results`` (not yet counted) published ``checkpoints``:
        the trial goes on from the newest; each notes how many results it accounts for."""
        for ckpt in checkpoints:
            ckpt.results = self.num_results + results_through(results, ckpt.iteration)
            ckpt.exploit = self.exploits
        if checkpoints:
            last = checkpoints[-1]
            self.restore, self.restore_iteration = self.checkpoint_path(last.name), last.iteration
            self.restore_results = last.results
            self.rebuild = None  # it trained on from the cloned state after all (a worker's copy)

    def state(self) -> dict[str, Any]:
        t = self.trial
        return {
            "trial_id": t.trial_id,
            "index": self.index,
            "dirname": self.dirname,
            "config": t.config,
            "status": t.status.value,
            "experiment_tag": t.experiment_tag,
            "trainable_name": t.trainable_name,
            "name": t.custom_name,
            "evaluated_params": t.evaluated_params,
            "last_train_time": t.last_train_time,
            "num_results": self.num_results,
            "restore": self.restore,
            "restore_iteration": self.restore_iteration,
            "restore_results": self.restore_results,
            "replay_through": self.replay_through,
            "checkpoints": [
                {
                    "name": c.name,
                    "iteration": c.iteration,
                    "result": c.result,
                    "results": c.results,
                    "digest": c.digest,
                    "exploit": c.exploit,
                }
                for c in self.checkpoints
            ],
            "num_failures": self.num_failures,
            "error": self.error,
            "lineage": self.lineage,
            "generation": self.generation,
            "start": self.start.state() if self.start is not None else None,
            "rebuild": self.rebuild.state() if self.rebuild is not None else None,
            "csv_header": self.csv_header,
            "first_config": self.first_config,
        }

    @classmethod
    def from_state(cls, t: dict[str, Any], last_result: dict[str, Any]) -> TrialRecord:
        """The record a commit's ``state()`` describes, with the trial's last committed
        result.

        A trial committed as RUNNING is PENDING again: its segment's result was
        never committed.
        """
        status = TrialStatus(t["status"])
        if status == TrialStatus.RUNNING:
            status = TrialStatus.PENDING
        trial = Trial(
            trial_id=t["trial_id"],
            config=t["config"],
            status=status,
            last_train_time=t["last_train_time"],
            experiment_tag=t["experiment_tag"],
            trainable_name=t.get("trainable_name", ""),  # older commits lack both
            custom_name=t.get("name"),
            evaluated_params=t.get("evaluated_params", {}),  # older commits lack it
        )
        trial.last_result = last_result
        start = t.get("start")  # older commits lack it
        return cls(
            trial=trial,
            index=t["index"],
            dirname=t["dirname"],
            restore=t["restore"],
            restore_iteration=t["restore_iteration"],
            restore_results=t.get("restore_results"),
            replay_through=t.get("replay_through", 0),
            checkpoints=[CheckpointRecord(**c) for c in t["checkpoints"]],
            num_results=t["num_results"],
            num_failures=t["num_failures"],
            error=t["error"],
            lineage=t["lineage"],
            generation=t["generation"],
            start=LineageStart(**start) if start is not None else None,
            rebuild=Rebuild(**t["rebuild"]) if t.get("rebuild") is not None else None,
            csv_header=t["csv_header"],
            first_config=t.get("first_config"),  # older commits lack it
        )


def results_through(results: list[dict[str, Any]], iteration: int) -> int:
    """How many of a segment's ``results`` lead up to its checkpoint at ``iteration``
    (the checkpoint holds the state after the result of that iteration)."""
    for i in range(len(results) - 1, -1, -1):
        if results[i].get("training_iteration") == iteration:
            return i + 1
    return len(results)


def clone_into(target: TrialRecord, source: TrialRecord, exploit: Exploit) -> list[Any]:
    """Carry out an exploit on the records: ``target`` restores from ``source``'s
    checkpoint (unless they are one trial) with the explored config; its lineage
    grows by the exploit's policy entry, which is returned."""
    if source is not target:
        target.restore, target.restore_iteration = source.restore, source.restore_iteration
        target.restore_results = target.num_results  # its own results stay, as in Ray
        target.replay_through = 0  # a new lineage: all its results are new to the scheduler
        target.generation += 1
    if target.first_config is None:
        target.first_config = target.trial.config
    target.trial.config = exploit.new_config
    target.trial.experiment_tag = exploit.new_tag
    if target.restore is not None:  # the state the new config goes on from
        target.start = LineageStart(
            target.restore, target.restore_iteration, target.restore_results, target.exploits + 1
        )
    entry = jsonable(exploit.policy_entry())
    target.lineage = [*source.lineage, entry] if source is not target else [*target.lineage, entry]
    return entry


def restore_digest(by_dir: Mapping[str, TrialRecord], path: str | None) -> str | None:
    """The committed version of the checkpoint at ``path`` (whichever trial owns it), for
    a worker that holds its own copy of it; None when unknown."""
    if path is None:
        return None
    dirname, _, name = path.rpartition("/")
    owner = by_dir.get(dirname)
    found = owner and next((c for c in owner.checkpoints if c.name == name), None)
    return found.digest if found else None


def _nothing(*_: Any) -> None:
    pass


class TrialTable:
    """The trials of one run by id, changed only as the scheduler decides.

    - ``exploit(exploit, reporter)``: carry out one exploit (``reporter``: the
      trial whose result led to it, or None for a barrier's release);
    - ``leave(trial)``: a trial that another trial's decision stopped;
    - ``ended(trial)``: any trial that ends without error (after ``leave``);
    - ``before_call()``: runs before every scheduler call (the controller
      reseeds the user's global RNGs there, so callables in
      ``hyperparam_mutations`` draw repeatable values).
    """

    def __init__(
        self,
        scheduler: TrialScheduler,
        trials: Iterable[Trial],
        exploit: Callable[[Exploit, Trial | None], None],
        leave: Callable[[Trial], None] = _nothing,
        before_call: Callable[[], None] = _nothing,
        ended: Callable[[Trial], None] = _nothing,
    ) -> None:
        self.scheduler = scheduler
        self.trials = {t.trial_id: t for t in trials}
        self._exploit = exploit
        self._leave = leave
        self._before_call = before_call
        self._ended = ended

    def report(self, trial: Trial, result: dict[str, Any]) -> Decision:
        """Give ``result`` to the scheduler and apply what it decides for other trials.

        The reporting trial's own action is the caller's to settle, once its
        segment's results are all reported (:meth:`end_segment`).
        """
        self._before_call()
        decision = Decision.of(self.scheduler.on_trial_result(trial, result))
        self.apply(decision, trial)
        return decision

    def apply(self, decision: Decision, reporter: Trial | None) -> None:
        """Carry out ``decision``'s exploits, then its actions on other trials."""
        for exploit in decision.exploits:
            self._exploit(exploit, reporter)
        removed = False
        for trial_id, action in decision.others.items():
            other = self.trials[trial_id]
            if other.status == TrialStatus.RUNNING and other is not reporter:
                logger.warning("ignoring %s for running trial %s", action, trial_id)
            elif action == Action.CONTINUE and other.status == TrialStatus.PAUSED:
                other.status = TrialStatus.PENDING
            elif action == Action.PAUSE and other.status == TrialStatus.PENDING:
                other.status = TrialStatus.PAUSED
            elif action == Action.STOP and other.is_live:
                other.status = TrialStatus.TERMINATED
                self._leave(other)
                self.scheduler.on_trial_remove(other)
                self._ended(other)
                removed = True
        if removed:
            self.release_paused()

    def release_paused(self) -> None:
        """A trial left: the scheduler may release trials waiting at a barrier."""
        self._before_call()
        decision = self.scheduler.release_paused()
        if decision is not None:
            self.apply(decision, None)

    def end_segment(self, trial: Trial, action: Action, terminal: bool) -> None:
        """The trial's status after its segment: ``terminal`` (it finished, or met a stop
        condition) or STOP ends it, PAUSE parks it, CONTINUE makes it runnable."""
        if terminal or action == Action.STOP:
            trial.status = TrialStatus.TERMINATED
            self.scheduler.on_trial_complete(trial, trial.last_result)
            self._ended(trial)
            self.release_paused()
        elif action == Action.PAUSE:
            trial.status = TrialStatus.PAUSED
        else:
            trial.status = TrialStatus.PENDING

    def fail(self, trial: Trial) -> None:
        """The trial errored for good."""
        trial.status = TrialStatus.ERROR
        self.scheduler.on_trial_error(trial)
        self.release_paused()


def stopped_early(status: str, reached: float, horizon: float) -> bool:
    """A trial ``status`` TERMINATED at ``reached`` (its ``time_attr``) ended before the
    furthest any trial got (``horizon``): a scheduler (ASHA, HyperBand, median stopping)
    or a stopper ended it; at the horizon it finished. Commits do not record why a trial
    ended, so this is the rule the leaderboard, the summary and the plots share."""
    return status == TrialStatus.TERMINATED and reached < horizon
