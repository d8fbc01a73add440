"""``popflow resume``: continue an experiment from its last committed round with the
arguments its run kept (``.popflow/run_args.json``: trainable, scheduler, stop, seed,
budget, and the Dask scheduler's address if it was given one).

A command line changes only where and how long this run goes: the cluster
(``--dask-address``, or ``--n-workers`` for an embedded one) and its budget
(``--max-rounds``, ``--run-budget-s``; ``none`` for no limit). The rest is the
experiment's own (as Ray's ``Tuner.restore``). A run that stops at its budget
says so, and how to go on.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from popflow.flows.api.cli_reading import (
    UserError,
    read_experiment,
    reading,
    resume_command,
    split_path,
)

if TYPE_CHECKING:
    from popflow.flows.experiment.reading import CommittedExperiment
    from popflow.flows.experiment.results import ResultGrid

NO_LIMIT = "none"


def _limit(kind: Callable[[str], float], rule: str) -> Callable[[str], float | str]:
    """An argparse ``type``: a positive ``kind``, or ``none`` (no limit)."""

    def parse(text: str) -> float | str:
        if text.strip().lower() == NO_LIMIT:
            return NO_LIMIT
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not value > 0:
            raise argparse.ArgumentTypeError(f"is {text!r}, but must be {rule} or '{NO_LIMIT}'")
        return value

    return parse


def add_resume_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dask-address",
        metavar="ADDRESS",
        help="a Dask scheduler to run on (default: the run's own, if it was given one; else "
        "an embedded cluster)",
    )
    parser.add_argument(
        "--n-workers",
        type=int,
        metavar="N",
        help="run on an embedded cluster of so many workers (not on the run's scheduler)",
    )
    parser.add_argument(
        "--max-rounds",
        type=_limit(int, "an int >= 1"),
        metavar="N",
        help=f"end this run after N rounds (default: the run's max_rounds; {NO_LIMIT}: no limit)",
    )
    parser.add_argument(
        "--run-budget-s",
        type=_limit(float, "a number of seconds > 0"),
        metavar="S",
        help=f"end this run after S seconds, resumably (default: the run's run_budget_s; "
        f"{NO_LIMIT}: no limit)",
    )
    parser.add_argument(
        "--force-takeover",
        action="store_true",
        help="take the experiment from a driver whose lease still looks held (only if "
        "that driver is known to be gone: a live one stops at its next write, and the "
        "round it was in runs again here)",
    )


def resume(args: argparse.Namespace) -> int:
    from popflow.flows.api.launch import run
    from popflow.infra.cluster.scheduler_link import SchedulerUnreachable
    from popflow.infra.store.lease import LeaseHeldError, break_lease

    # as `python -m` would: the trainable's module may live in the folder run from
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    parent, name = split_path(args.path)
    before = read_experiment(args)  # a clear message if there is nothing, before Prefect starts
    run_args = _saved_run_args(before)
    _check_resumable(before, run_args)
    run_args.update(cluster_choice(args, run_args), **budget_choice(args))
    url = before.storage.url
    if args.force_takeover:
        try:
            with reading(before.storage):
                broken = break_lease(before.storage)
        except LeaseHeldError as e:  # a driver took it meanwhile, or a planted lease file
            raise UserError(str(e)) from e
        if broken is not None:
            print(
                f"popflow: took {url} over from pid {broken.get('pid')} on "
                f"{broken.get('host')} (--force-takeover); that driver, if it still runs, "
                "stops at its next write",
                file=sys.stderr,
            )
    if run_args["dask_address"] is not None and args.dask_address is None:
        print(
            f"popflow: resuming on the run's Dask scheduler {run_args['dask_address']} "
            "(--dask-address or --n-workers for another)",
            file=sys.stderr,
        )
    try:
        results = run(
            **run_args,
            storage=parent,
            storage_options=before.storage.storage_options or None,
            name=name,
            resume=True,
        )
    except LeaseHeldError as e:
        raise UserError(str(e), f"popflow status {url} shows it") from e
    except SchedulerUnreachable as e:
        raise UserError(
            str(e), "--dask-address ADDRESS, or --n-workers N for a local cluster"
        ) from e
    except (ValueError, TypeError) as e:  # an argument check: the stored arguments' values
        raise UserError(str(e), "--verbose shows where") from e
    for line in ended_lines(before, read_experiment(args), results, run_args, args):
        print(line)
    return 0


def _saved_run_args(experiment: CommittedExperiment) -> dict[str, Any]:
    """The arguments the experiment's run kept, as one :class:`UserError` if it kept none
    that can be used here."""
    from popflow.flows.spec.run_args import BadRunArgs, CodeNotFound, load_run_args

    try:
        with reading(experiment.storage):
            return load_run_args(experiment.storage)
    except FileNotFoundError as e:
        raise UserError(
            f"{experiment.storage.url} kept no arguments to resume with (its run could not "
            "save them; its log said why)",
            "resume it from Python: run(<the same arguments>, resume=True)",
        ) from e
    except (CodeNotFound, BadRunArgs) as e:
        raise UserError(str(e)) from e


def cluster_choice(args: argparse.Namespace, run_args: dict[str, Any]) -> dict[str, Any]:
    """``dask_address`` and ``n_workers`` for this run: ``--dask-address``; else an embedded
    cluster if ``--n-workers`` asks for one; else the scheduler the run was given."""
    address = args.dask_address
    if address is None and args.n_workers is None:
        address = run_args.get("dask_address")
    return {"dask_address": address, "n_workers": args.n_workers}


def budget_choice(args: argparse.Namespace) -> dict[str, Any]:
    """The budget arguments the command line changes (``none``: no limit)."""
    given = {"max_rounds": args.max_rounds, "run_budget_s": args.run_budget_s}
    return {k: None if v == NO_LIMIT else v for k, v in given.items() if v is not None}


def ended_lines(
    before: CommittedExperiment,
    after: CommittedExperiment,
    results: ResultGrid,
    run_args: dict[str, Any],
    args: argparse.Namespace,
) -> list[str]:
    """What the run did: finished, or stopped at its budget with trials to go (and how to
    go on)."""
    total = f"{len(results)} trials"
    errors = f"{results.num_errors} errors, in {results.experiment_path}"
    if after.finished:
        return [f"{after.name}: finished, {total}, {errors}"]
    rounds = after.round - before.round
    max_rounds, seconds = run_args.get("max_rounds"), run_args.get("run_budget_s")
    to_go = sum(1 for r in after.records if r.trial.is_live)
    if max_rounds is None and seconds is None:  # a scheduler that chose no trial to run
        return [
            f"{after.name}: unfinished at round {after.round}; {to_go} of {total} to go, {errors}"
        ]
    if seconds is None or (max_rounds is not None and rounds >= max_rounds):
        knob, flag, value, unit = "max_rounds", "--max-rounds", f"{max_rounds}", "rounds"
    else:
        knob, flag, value, unit = "run_budget_s", "--run-budget-s", f"{seconds:g}", "s"
    return [
        f"{after.name}: stopped at its budget ({knob}={value}) after {rounds} "
        f"round{'' if rounds == 1 else 's'}, at round {after.round}; {to_go} of {total} to go, "
        f"{errors}",
        f"go on with: {resume_command(args, after.storage.url)} {flag} {value} ({value} {unit} "
        f"more; {flag} {NO_LIMIT}: to the end)",
    ]


def _check_resumable(experiment: CommittedExperiment, run_args: dict[str, Any]) -> None:
    """What a resume reads besides the trial table, tried before anything is written: the
    seed, and the commit's scheduler state, given to a copy of the run's scheduler."""
    from popflow.infra.store.layout import EXPERIMENT_FILE, commit_path

    if experiment.seed is None:
        raise UserError(
            f"{experiment.storage.full_url(EXPERIMENT_FILE)} has no 'seed' to resume with"
        )
    scheduler = copy.deepcopy(run_args.get("scheduler"))
    if scheduler is None:
        return  # run() starts FIFO's own
    try:
        scheduler.set_state(experiment.scheduler_state)
    except (LookupError, TypeError, ValueError, AttributeError) as e:
        seq = experiment.commit["seq"]
        commit = experiment.storage.full_url(commit_path(seq))
        raise UserError(
            f"{commit} holds a scheduler state {type(scheduler).__name__} cannot take "
            f"({type(e).__name__}: {e}); nothing was changed"
        ) from e
