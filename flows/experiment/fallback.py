"""Where a trial goes back to when a checkpoint it needs failed its check: the newest
state on its lineage (its own checkpoints since its last exploit, else the state that
exploit cloned, made again by a rebuild, else its start), never its own state from
before an exploit under the exploit's config; and which checkpoints retention must keep
for that (:func:`pinned`). The records are :mod:`popflow.flows.experiment.trial_table`'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from popflow.flows.experiment.trial_table import LineageStart, Rebuild, TrialRecord
from popflow.schedulers import TrialStatus
from popflow.tasks.specs import CheckpointRecord


def pinned(records: Iterable[TrialRecord]) -> set[str]:
    """Checkpoints (paths relative to the experiment) that retention and clean-up keep:
    those a trial restores from, each unended trial's lineage start (its fallback
    when all it wrote since is damaged), and where a pending rebuild starts."""
    out = {r.restore for r in records if r.restore}
    out |= {
        r.start.restore
        for r in records
        if r.start is not None and r.trial.status != TrialStatus.TERMINATED
    }
    out |= {r.rebuild.restore for r in records if r.rebuild is not None and r.rebuild.restore}
    return out


#: What :func:`fall_back_from` says when the state before is the trial's start (no checkpoint)
FROM_THE_START = "the start (no checkpoint)"


@dataclass(frozen=True)
class _Before:
    """A state to go back to: ``path`` (None: the trial's start), at ``iteration``, when
    ``results`` of its owner's results were logged."""

    path: str | None
    iteration: int
    results: int | None


def fall_back_from(records: list[TrialRecord], path: str) -> str | None:
    """Stop using the checkpoint at ``path`` (it failed its check); every trial that
    would restore from it goes back along ``path``'s lineage instead, to the newest
    state before it: its owner's earlier checkpoint written since the same exploit, else
    that exploit's source checkpoint (the state the exploit cloned, which goes with the
    config the exploit chose), else, for a lineage no exploit began, the trial's start;
    never a checkpoint of another lineage (the owner's own from before the exploit:
    other state, trained with another config).

    A trial whose newest exploit cloned that very state (another trial's, or its own for
    an exploit of itself) and that has not trained on from it since gets that state made
    again (:class:`Rebuild`): going back further would train the source's older state
    under the config the exploit chose.

    Returns what they go back to (a path, or :data:`FROM_THE_START`), or None when
    there is nothing: those trials cannot go on.
    """
    owner = next((r for r in records if path.startswith(f"{r.dirname}/")), None)
    if owner is None:
        return None
    bad = next((c for c in owner.checkpoints if owner.checkpoint_path(c.name) == path), None)
    if bad is None:  # unknown or dropped already: nothing says where its lineage went
        return None
    before = _state_before(records, owner, bad.iteration, bad.exploit, path)
    owner.checkpoints.remove(bad)
    went: str | None = None
    for rec in records:
        if rec.restore != path:
            continue
        if rec.start is not None and rec.start.restore == path and rec.lineage:
            rec.rebuild = _rebuild(owner, bad, before, rec)
            if rec.rebuild is not None:
                went = went or _said(rec.rebuild.restore)
            continue
        if before is None or (before.path is None and rec is not owner):
            continue
        rec.restore, rec.restore_iteration = before.path, before.iteration
        went = went or _said(before.path)
        if rec is owner:  # its results after the fallback's state are superseded
            rec.restore_results = before.results
        elif rec.lineage and rec.lineage[-1][2] == bad.iteration:
            # (commits from before lineage starts were kept) a clone that went on from the
            # iteration it had reached: so it does again, a few iterations back
            back = bad.iteration - before.iteration
            if rec.restore_results is not None:
                rec.restore_results = max(0, rec.restore_results - back)
    if went is None and before is not None and not any(r.restore == path for r in records):
        went = _said(before.path)  # no trial restored from it: nothing to move
    return went


def _said(path: str | None) -> str:
    return path if path is not None else FROM_THE_START


def _rebuild(
    owner: TrialRecord, bad: CheckpointRecord, before: _Before | None, rec: TrialRecord
) -> Rebuild | None:
    """How ``rec`` gets the state its exploit cloned from ``bad`` (its ``owner``'s) made
    again, from ``before`` (None: it cannot be)."""
    if before is None:
        return None
    if owner is not rec and bad.exploit in (None, owner.exploits):
        config = owner.trial.config  # the source trained to ``bad`` with it, and still has it
    else:  # an exploit of itself, or the source has had another exploit since: the
        # exploit's log holds the source's config then (seeds: its generation now)
        config = rec.lineage[-1][4]
    return Rebuild(
        source=owner.dirname,
        lineage=bad.exploit,
        through=bad.iteration,
        config=config,
        index=owner.index,
        generation=owner.generation,
        restore=before.path,
        iteration=before.iteration,
    )


def rebuild_again(records: list[TrialRecord], rec: TrialRecord) -> bool:
    """``rec``'s rebuild could not restore its start (that checkpoint failed its check and
    was dropped): start it from the state before that one on the same lineage. False when
    there is none."""
    r = rec.rebuild
    owner = next((o for o in records if o.dirname == r.source), None) if r else None
    if r is None or owner is None:
        return False
    before = _state_before(records, owner, r.through, r.lineage, None)
    if before is None:
        return False
    rec.rebuild = Rebuild(
        r.source,
        r.lineage,
        r.through,
        r.config,
        r.index,
        r.generation,
        before.path,
        before.iteration,
    )
    return True


def rebuilt(rec: TrialRecord, ckpt: CheckpointRecord) -> None:
    """``rec``'s rebuild saved ``ckpt`` (in its own folder): the state its exploit cloned.
    It goes on from there as after the exploit; its lineage starts there."""
    start = rec.start
    assert start is not None and rec.rebuild is not None
    ckpt.exploit, ckpt.results = start.exploit, start.results
    rec.checkpoints.append(ckpt)
    rec.restore = rec.checkpoint_path(ckpt.name)
    rec.restore_iteration, rec.restore_results = ckpt.iteration, start.results
    rec.start = LineageStart(rec.restore, ckpt.iteration, start.results, start.exploit)
    rec.rebuild = None


def _state_before(
    records: list[TrialRecord],
    owner: TrialRecord,
    iteration: int,
    part: int | None,
    path: str | None,
) -> _Before | None:
    """The newest state on the lineage ``part`` of ``owner`` (how many exploits it had had)
    before ``iteration``, but for ``path`` itself; None if there is none.

    The owner's checkpoints written since the same exploit (commits from before this was
    kept: any of its checkpoints), older than ``iteration``; else, for its current
    lineage, where that lineage started if that checkpoint is still there to restore
    from; else, for a lineage no exploit began, the trial's start.
    """
    earlier = [
        c
        for c in owner.checkpoints
        if owner.checkpoint_path(c.name) != path
        and c.iteration < iteration
        and (part is None or c.exploit is None or c.exploit == part)
    ]
    if earlier:
        fallback = max(earlier, key=lambda c: c.iteration)
        return _Before(
            owner.checkpoint_path(fallback.name),
            fallback.iteration,
            _results_at(owner, fallback, iteration, path),
        )
    if part == 0 or (part is None and not owner.lineage):
        return _Before(None, 0, 0)  # its first lineage: it trained there from the start
    start = owner.start
    if start is None or part is None or part != start.exploit:
        return None
    if start.restore == path:
        return None  # an exploit of itself from the damaged checkpoint
    if not _listed(records, start.restore):
        return None  # retired (a commit from before starts were kept) or damaged
    return _Before(start.restore, start.iteration, start.results)


def _listed(records: list[TrialRecord], path: str) -> bool:
    """A trial still lists the checkpoint at ``path`` (it was neither retired nor found
    damaged)."""
    dirname, _, name = path.rpartition("/")
    return any(r.dirname == dirname and any(c.name == name for c in r.checkpoints) for r in records)


def _results_at(
    owner: TrialRecord, fallback: CheckpointRecord, iteration: int, path: str | None
) -> int | None:
    """How many of ``owner``'s results ``fallback``'s state accounts for: as recorded,
    else (older commits) counted back from the damaged checkpoint's (``path``, at
    ``iteration``), a result per iteration."""
    if fallback.results is not None:
        return fallback.results
    bad = next((c for c in owner.checkpoints if owner.checkpoint_path(c.name) == path), None)
    if bad is not None and bad.results is not None:
        return max(0, bad.results - (iteration - fallback.iteration))
    return owner.restore_results
