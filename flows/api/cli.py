"""The ``popflow`` command: inspect or resume an experiment in storage.

popflow status ./results/pbt_benchmark      # finished/running/interrupted, best trial, trials
popflow show ./results/pbt_benchmark        # the latest commit's trials, as committed
popflow resume ./results/pbt_benchmark      # on the run's Dask scheduler, with its budget
popflow resume ./results/pbt_benchmark --max-rounds 5   # 5 rounds more (none: to the end)
popflow resume s3://bucket/experiments/pbt --storage-options '{"endpoint_url": "..."}'
popflow resume s3://bucket/experiments/pbt --credentials-block aws-credentials/my-creds
popflow plot ./results/pbt_benchmark        # PNGs in ./results/pbt_benchmark/plots/
popflow plot ./results/pbt_benchmark --out ./figs   # or elsewhere
popflow server                              # the local Prefect server's UI address, if up
popflow server start                        # start it for deployments (eval "$(...)" sets
                                            # PREFECT_API_URL); a second start reuses it
popflow server stop                         # stop it (a later run starts it again)

status and show never write to the experiment's storage, and plot writes only
its PNGs (into --out, by default <path>/plots/); none takes the lease, so a
running experiment is not disturbed. A mistake (no experiment there, a bad URL,
a missing bucket, missing credentials, a log file that is not what popflow
writes) is one line on stderr with a hint and exit status 2; ``popflow --verbose
...`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys

from popflow.flows.api.cli_reading import (
    UserError,
    read_experiment,
    reading,
    resume_command,
    storage_of,
    user_error,
)
from popflow.flows.api.cli_resume import add_resume_arguments
from popflow.flows.api.cli_server import add_server_arguments, server_command
from popflow.infra.storage.options_cli import add_storage_arguments

# Each command imports what it needs when it runs: `popflow --help` imports no fsspec,
# numpy, Dask or Prefect (heavy imports), and `status`/`show` no Dask or Prefect.

# -- the commands ----------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    from popflow.flows.console.status_view import status_lines
    from popflow.flows.experiment.reading import state_of
    from popflow.infra.store.lease import live_holder

    experiment = read_experiment(args)
    with reading(experiment.storage):
        driver = live_holder(experiment.storage)
    state = state_of(experiment, driver)
    width = shutil.get_terminal_size().columns
    resume = resume_command(args, experiment.storage.url)
    for line in status_lines(experiment, state, driver, width, resume):
        print(line)
    return 0


def _show(args: argparse.Namespace) -> int:
    """The latest commit as it is: each trial's committed status, results and metric."""
    from popflow.flows.console.status_view import value_text
    from popflow.flows.experiment.results import committed_results

    experiment = read_experiment(args)
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
    from popflow.flows.api.cli_resume import resume

    return resume(args)


def _plot(args: argparse.Namespace) -> int:
    from popflow.flows.plots.data import NoMetric
    from popflow.flows.plots.figures import PlotsUnavailable, plot_experiment

    storage = storage_of(args)
    try:
        with reading(storage):
            paths = plot_experiment(
                storage.url,
                storage.storage_options,
                out=args.out,
                time_attr=args.time_attr,
                metric=args.metric,
                log_y=args.log_y,
            )
    except (NoMetric, PlotsUnavailable) as e:
        raise UserError(str(e)) from e
    for path in paths:
        print(path)
    return 0


def _quiet_console() -> None:
    """popflow's and Prefect's INFO on the console; not a line per HTTP request."""
    from popflow.flows.console.verbose import quiet_http_requests

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    quiet_http_requests()
    # Dask's INFO is its own chatter (a client's comm closing as the run ends, with a
    # trace): its warnings and errors still show
    logging.getLogger("distributed").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    """Run the ``popflow`` command; its exit status. A reader that stops early (``popflow
    status ... | head``) ends it quietly, with status 1, as Python's docs recommend."""
    try:
        try:
            return _command(argv)
        finally:
            sys.stdout.flush()  # a reader gone shows here, not in the interpreter's exit
    except BrokenPipeError:
        # nothing more reaches that reader: what is left to print goes nowhere
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _command(argv: list[str] | None) -> int:
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
            add_resume_arguments(p)
    p = sub.add_parser("plot", help="draw an experiment's trials as PNGs (needs popflow[plots])")
    p.add_argument("path", help="<storage>/<name>: a local folder or an fsspec URL")
    add_storage_arguments(p)
    p.add_argument("--out", metavar="DIR", help="where to write the PNGs (default: <path>/plots)")
    p.add_argument("--metric", help="the result key to plot (default: the experiment's metric)")
    p.add_argument(
        "--time-attr", default="training_iteration", help="the x axis (default: %(default)s)"
    )
    p.add_argument("--log-y", action="store_true", help="the metric on a log scale")
    p = sub.add_parser("server", help="the local Prefect server that runs start and reuse")
    add_server_arguments(p)
    args = parser.parse_args(argv)
    _quiet_console()
    commands = {
        "status": _status, "show": _show, "resume": _resume, "plot": _plot,
        "server": server_command,
    }  # fmt: skip
    try:
        return commands[args.command](args)
    except UserError as e:
        if args.verbose:
            raise
        user_error(str(e))


if __name__ == "__main__":
    sys.exit(main())
