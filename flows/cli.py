"""The ``popflow`` command: inspect or resume an experiment in storage.

popflow status ./results/pbt_benchmark      # finished/running/interrupted, best trial, trials
popflow show ./results/pbt_benchmark        # the latest commit's trials, as committed
popflow resume ./results/pbt_benchmark
popflow resume s3://bucket/experiments/pbt --storage-options '{"endpoint_url": "..."}'
popflow resume s3://bucket/experiments/pbt --credentials-block aws-credentials/my-creds
popflow plot ./results/pbt_benchmark        # PNGs in ./results/pbt_benchmark/plots/
popflow server                              # the local Prefect server's UI address, if up
popflow server stop                         # stop it (a later run starts it again)

status, show and plot only read: a running experiment is not disturbed. A
mistake (no experiment there, a bad URL, a missing bucket, missing credentials,
a log file that is not what popflow writes) is one line on stderr with a hint
and exit status 2; ``popflow --verbose ...`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import posixpath
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

from popflow.flows.experiment_read import (
    CommittedExperiment,
    MalformedExperiment,
    NoExperiment,
    read_committed,
    state_of,
)
from popflow.flows.results import committed_results
from popflow.flows.run_args import BadRunArgs, CodeNotFound, load_run_args
from popflow.flows.status_view import status_lines, value_text
from popflow.infra import local_server
from popflow.infra.experiment_log import EXPERIMENT_FILE, DamagedLog, ExperimentLog
from popflow.infra.lease import LeaseHeldError, break_lease, live_holder
from popflow.infra.storage import Storage, StorageError, UnsafePath
from popflow.infra.storage_cli import add_storage_arguments, resolve_storage_options

#: what a storage error says when the store wants credentials it was not given
_CREDENTIAL_SIGNS = (
    "NoCredentialsError",
    "Unable to locate credentials",
    "PermissionError",
    "AccessDenied",
    "Access Denied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "Forbidden",
)
_CREDENTIALS_HINT = (
    "give credentials: --credentials-block NAME, --storage-options "
    '\'{"key": "...", "secret": "..."}\' or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY'
)


class UserError(Exception):
    """A mistake the user can mend: one line on stderr, with ``hint``, and exit status 2."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        message = str(self.args[0])
        return f"{message} ({self.hint})" if self.hint else message


def _user_error(message: str) -> NoReturn:
    """One line on stderr and exit status 2 (argparse's for a usage error)."""
    print(f"popflow: {message}", file=sys.stderr)
    raise SystemExit(2)


# -- opening and reading an experiment ------------------------------------------------


def _split(given: str) -> tuple[str, str]:
    path = given.rstrip("/")
    parent, name = posixpath.split(path)
    if not name or name.endswith(":"):  # "/" or "s3://" names no folder
        raise UserError(f"{given!r} does not name an experiment folder", "give <storage>/<name>")
    return parent or ".", name


def _options(args: argparse.Namespace) -> dict[str, Any] | None:
    """The storage options of ``args``' flags (a credentials block is loaded here)."""
    try:
        return resolve_storage_options(args.path, args.storage_options, args.credentials_block)
    except (ValueError, ImportError) as e:  # no such block, an S3 block for a local path
        raise UserError(str(e)) from e


def _open(url: str, options: dict[str, Any] | None) -> Storage:
    try:
        return Storage(url, options)
    except (ValueError, ImportError) as e:  # "Protocol not known", "Install gcsfs to ..."
        raise UserError(
            f"cannot open {url!r}: {e}",
            "give a local folder or an fsspec URL such as s3://bucket/prefix",
        ) from e


def _storage_error(e: StorageError) -> UserError:
    text = str(e)
    if any(sign in text for sign in _CREDENTIAL_SIGNS):
        return UserError(text, _CREDENTIALS_HINT)
    return UserError(text, "check the URL, and --storage-options (endpoint_url) for its store")


def _experiments_in(storage: Storage, limit: int = 20) -> list[str]:
    """The experiments directly under ``storage`` (a storage root given for an experiment)."""
    try:
        names = storage.listdir()[:limit]
        return [n for n in names if storage.file_exists(n, EXPERIMENT_FILE)]
    except OSError:
        return []


@contextmanager
def _reading(storage: Storage) -> Iterator[None]:
    """Errors reading the experiment at ``storage`` as one :class:`UserError` each."""
    try:
        yield
    except NoExperiment as e:
        found = _experiments_in(storage)
        hint = f"it holds the experiments {', '.join(found)}: give {storage.url}/<name>"
        raise UserError(str(e), hint if found else "") from e
    except StorageError as e:
        raise _storage_error(e) from e
    except (DamagedLog, MalformedExperiment, UnsafePath) as e:
        raise UserError(str(e)) from e


def _storage(args: argparse.Namespace) -> Storage:
    """The experiment folder ``args`` name, its options resolved (nothing read yet)."""
    _split(args.path)
    return _open(args.path, _options(args))


def _read(args: argparse.Namespace) -> CommittedExperiment:
    """The experiment at ``args.path`` as of its latest commit (reads only)."""
    storage = _storage(args)
    with _reading(storage):
        return read_committed(storage.url, storage.storage_options)


def _resume_command(args: argparse.Namespace, url: str) -> str:
    """The command that resumes ``url`` (storage options are never echoed: secrets)."""
    command = f"popflow resume {url}"
    if args.credentials_block:
        command += f" --credentials-block {args.credentials_block}"
    if args.storage_options is not None:
        command += " --storage-options '...'"
    return command


# -- the commands ----------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    experiment = _read(args)
    with _reading(experiment.storage):
        driver = live_holder(experiment.storage)
    state = state_of(experiment, driver)
    width = shutil.get_terminal_size().columns
    resume = _resume_command(args, experiment.storage.url)
    for line in status_lines(experiment, state, driver, width, resume):
        print(line)
    return 0


def _show(args: argparse.Namespace) -> int:
    """The latest commit as it is: each trial's committed status, results and metric."""
    experiment = _read(args)
    state = "finished" if experiment.finished else "unfinished"
    print(
        f"{experiment.name}: {state}, round {experiment.round}, seed {experiment.seed}, "
        f"{experiment.scheduler}"
    )
    metric = experiment.metric
    grid = committed_results(experiment)
    for t, r in zip(experiment.commit["trials"], grid, strict=True):
        value = value_text(r.metrics[metric]) if metric and metric in r.metrics else "-"
        shown = f"  {metric} {value:<10}" if metric else ""
        print(
            f"  {t['trial_id']}  {t['status']:<10}  results {t['num_results']:>5}{shown}  "
            f"config {t['config']}"
        )
    if metric:
        print(f"metric: {metric} ({experiment.mode})")
    return 0


def _resume(args: argparse.Namespace) -> int:
    from popflow.flows.launch import run

    # as `python -m` would: the trainable's module may live in the folder run from
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    parent, name = _split(args.path)
    experiment = _read(args)  # a clear message if there is nothing, before Prefect starts
    options = experiment.storage.storage_options or None
    try:
        with _reading(experiment.storage):
            run_args = load_run_args(experiment.storage)
    except FileNotFoundError as e:
        raise UserError(
            f"{experiment.storage.url} kept no arguments to resume with (its run could not "
            "save them; its log said why)",
            "resume it from Python: run(<the same arguments>, resume=True)",
        ) from e
    except (CodeNotFound, BadRunArgs) as e:
        raise UserError(str(e)) from e
    _check_resumable(experiment, run_args)
    if args.force_takeover:
        with _reading(experiment.storage):
            broken = break_lease(experiment.storage)
        if broken is not None:
            print(
                f"popflow: took {experiment.storage.url} over from pid {broken.get('pid')} on "
                f"{broken.get('host')} (--force-takeover); that driver, if it still runs, "
                "stops at its next write",
                file=sys.stderr,
            )
    try:
        results = run(
            **run_args,
            storage=parent,
            storage_options=options,
            name=name,
            resume=True,
            dask_address=args.dask_address,
            n_workers=args.n_workers,
        )
    except LeaseHeldError as e:
        raise UserError(str(e), f"popflow status {experiment.storage.url} shows it") from e
    except (ValueError, TypeError) as e:  # an argument check: the stored arguments' values
        raise UserError(str(e), "--verbose shows where") from e
    print(
        f"{name}: {len(results)} trials, {results.num_errors} errors, in {results.experiment_path}"
    )
    return 0


def _check_resumable(experiment: CommittedExperiment, run_args: dict[str, Any]) -> None:
    """What a resume reads besides the trial table, tried before anything is written: the
    seed, and the commit's scheduler state, given to a copy of the run's scheduler."""
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
        commit = experiment.storage.full_url(ExperimentLog(experiment.storage).commit_path(seq))
        raise UserError(
            f"{commit} holds a scheduler state {type(scheduler).__name__} cannot take "
            f"({type(e).__name__}: {e}); nothing was changed"
        ) from e


def _plot(args: argparse.Namespace) -> int:
    from popflow.flows.plot_data import NoMetric
    from popflow.flows.plots import PlotsUnavailable, plot_experiment

    storage = _storage(args)
    try:
        with _reading(storage):
            paths = plot_experiment(
                storage.url,
                storage.storage_options,
                out=args.out,
                time_attr=args.time_attr,
                metric=args.metric,
            )
    except (NoMetric, PlotsUnavailable) as e:
        raise UserError(str(e)) from e
    for path in paths:
        print(path)
    return 0


def _server(args: argparse.Namespace) -> int:
    """The embedded default's Prefect server (:mod:`popflow.infra.local_server`)."""
    home = local_server.prefect_home()
    if args.action == "stop":
        stopped = local_server.stop(home)
        print(f"stopped the local Prefect server (pid {stopped.pid})" if stopped else
              f"no local Prefect server of {home} was running")  # fmt: skip
        return 0
    server = local_server.running(home)
    if server is None:
        print(f"no local Prefect server of {home} is running (the next run starts one)")
        return 0
    print(f"Prefect UI: {server.ui_url}  (API {server.api_url}; pid {server.pid}; home {home})")
    return 0


def _quiet_console() -> None:
    """popflow's and Prefect's INFO on the console; not a line per HTTP request."""
    from popflow.flows.console import quiet_http_requests

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    quiet_http_requests()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="popflow", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show a mistake's traceback, not one line"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command, help_text in (
        ("status", "say whether an experiment finished, runs or was interrupted, and its best"),
        ("show", "print an experiment's trials as its latest commit has them"),
        ("resume", "continue an experiment from its last committed round"),
    ):
        p = sub.add_parser(command, help=help_text)
        p.add_argument("path", help="<storage>/<name>: a local folder or an fsspec URL")
        add_storage_arguments(p)
        if command == "resume":
            p.add_argument("--dask-address", help="an existing Dask scheduler (default: embedded)")
            p.add_argument("--n-workers", type=int, help="workers of the embedded cluster")
            p.add_argument(
                "--force-takeover",
                action="store_true",
                help="take the experiment from a driver whose lease still looks held (only if "
                "that driver is known to be gone: a live one stops at its next write, and the "
                "round it was in runs again here)",
            )
    p = sub.add_parser("plot", help="draw an experiment's trials as PNGs (needs popflow[plots])")
    p.add_argument("path", help="<storage>/<name>: a local folder or an fsspec URL")
    add_storage_arguments(p)
    p.add_argument("--out", metavar="DIR", help="where to write the PNGs (default: <path>/plots)")
    p.add_argument("--metric", help="the result key to plot (default: the experiment's metric)")
    p.add_argument(
        "--time-attr", default="training_iteration", help="the x axis (default: %(default)s)"
    )
    p = sub.add_parser("server", help="the local Prefect server that runs start and reuse")
    p.add_argument("action", nargs="?", choices=("status", "stop"), default="status")
    args = parser.parse_args(argv)
    _quiet_console()
    commands = {
        "status": _status, "show": _show, "resume": _resume, "plot": _plot, "server": _server,
    }  # fmt: skip
    try:
        return commands[args.command](args)
    except UserError as e:
        if args.verbose:
            raise
        _user_error(str(e))


if __name__ == "__main__":
    sys.exit(main())
