"""The ``popflow`` command: resume or inspect an experiment in storage.

popflow resume ./results/pbt_benchmark
popflow resume s3://bucket/experiments/pbt --storage-options '{"endpoint_url": "..."}'
popflow resume s3://bucket/experiments/pbt --credentials-block aws-credentials/my-creds
popflow show ./results/pbt_benchmark
popflow plot ./results/pbt_benchmark        # PNGs in ./results/pbt_benchmark/plots/
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import posixpath
import sys
from typing import NoReturn

from popflow.flows.experiment import CodeNotFound, is_finished, load_run_args
from popflow.infra.experiment_log import EXPERIMENT_FILE, ExperimentLog
from popflow.infra.storage import Storage
from popflow.infra.storage_cli import add_storage_arguments, resolve_storage_options


def _split(path: str) -> tuple[str, str]:
    path = path.rstrip("/")
    parent, name = posixpath.split(path)
    if not name:
        raise SystemExit(f"popflow: {path!r} does not name an experiment folder")
    return parent or ".", name


def _experiment(args: argparse.Namespace) -> tuple[str, str, dict | None, Storage]:
    parent, name = _split(args.path)
    options = resolve_storage_options(args.path, args.storage_options, args.credentials_block)
    return parent, name, options, Storage(parent, options).child(name)


def _resume(args: argparse.Namespace) -> int:
    from popflow.flows.launch import run

    # as `python -m` would: the trainable's module may live in the folder run from
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    parent, name, options, storage = _experiment(args)
    try:
        run_args = load_run_args(storage)
    except FileNotFoundError:
        raise SystemExit(f"popflow: no experiment to resume at {storage.url}") from None
    except CodeNotFound as e:
        raise SystemExit(f"popflow: {e}") from None
    results = run(
        **run_args,
        storage=parent,
        storage_options=options,
        name=name,
        resume=True,
        dask_address=args.dask_address,
        n_workers=args.n_workers,
    )
    print(
        f"{name}: {len(results)} trials, {results.num_errors} errors, in {results.experiment_path}"
    )
    return 0


def _show(args: argparse.Namespace) -> int:
    _, name, _, storage = _experiment(args)
    commit = ExperimentLog(storage).latest()
    if commit is None:
        raise SystemExit(f"popflow: no committed experiment at {storage.url}")
    info = json.loads(storage.read_text(EXPERIMENT_FILE))
    metric = info.get("metric")
    state = "finished" if is_finished(commit) else "unfinished"
    print(f"{name}: {state}, round {commit['round']}, seed {info['seed']}, {info['scheduler']}")
    for t in commit["trials"]:
        print(
            f"  {t['trial_id']}  {t['status']:<10}  results {t['num_results']:>5}  config {t['config']}"
        )
    if metric:
        print(f"metric: {metric} ({info.get('mode')})")
    return 0


def _user_error(message: str) -> NoReturn:
    """One line on stderr and exit status 2 (argparse's for a usage error)."""
    print(f"popflow: {message}", file=sys.stderr)
    raise SystemExit(2)


def _plot(args: argparse.Namespace) -> int:
    from popflow.flows.plot_data import NoMetric
    from popflow.flows.plot_read import NoExperiment
    from popflow.flows.plots import PlotsUnavailable, plot_experiment

    _, _, options, storage = _experiment(args)
    try:
        paths = plot_experiment(
            storage.url, options, out=args.out, time_attr=args.time_attr, metric=args.metric
        )
    except (NoExperiment, NoMetric, PlotsUnavailable) as e:
        _user_error(str(e))
    for path in paths:
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="popflow", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command, help_text in (
        ("resume", "continue an experiment from its last committed round"),
        ("show", "print an experiment's trials"),
    ):
        p = sub.add_parser(command, help=help_text)
        p.add_argument("path", help="<storage>/<name>: a local folder or an fsspec URL")
        add_storage_arguments(p)
        if command == "resume":
            p.add_argument("--dask-address", help="an existing Dask scheduler (default: embedded)")
            p.add_argument("--n-workers", type=int, help="workers of the embedded cluster")
    p = sub.add_parser("plot", help="draw an experiment's trials as PNGs (needs popflow[plots])")
    p.add_argument("path", help="<storage>/<name>: a local folder or an fsspec URL")
    add_storage_arguments(p)
    p.add_argument("--out", metavar="DIR", help="where to write the PNGs (default: <path>/plots)")
    p.add_argument("--metric", help="the result key to plot (default: the experiment's metric)")
    p.add_argument(
        "--time-attr", default="training_iteration", help="the x axis (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    return {"resume": _resume, "show": _show, "plot": _plot}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
