"""The PBT benchmark as a Prefect flow: what ``prefect.yaml`` deploys.

A run of the deployment resumes the experiment of the same name ("auto"),
so a retried or re-triggered run continues where the last one stopped, and
a finished one is not trained again. A failed run retries twice (a mistake in
its parameters, a ValueError or TypeError, does not); a crashed one
is re-run by the automation in ``automations.yaml``. The trainable lives in
``pbt_benchmark.py``, which does not import Prefect: Dask workers import the
trainable's module, and have no use for Prefect.

    prefect deploy --name pbt-benchmark-smoke
    prefect deployment run pbt-benchmark/pbt-benchmark-smoke

Run directly, it says so; ``--run`` runs the flow once, here, without a deployment
(on ``PREFECT_API_URL``'s server, else on popflow's local one, as ``popflow.run`` does):

    python examples/pbt_benchmark_flow.py --run --smoke-test

On S3, name a prefect-aws block holding the credentials (only the name is a
flow-run parameter; the flow run loads the keys):

    prefect deployment run pbt-benchmark/pbt-benchmark-smoke \
        --param storage=s3://bucket/prefix --param credentials_block=aws-credentials/my-creds
"""

from __future__ import annotations

import argparse
import sys

from pbt_benchmark import run_benchmark
from prefect import flow
from prefect.states import Completed, State

from popflow.flows.record.flow_retries import mistakes_not_retried
from popflow.flows.record.plot_artifacts import plots_artifact
from popflow.flows.record.prefect_server import prefect_api
from popflow.infra.storage.options_cli import resolve_storage_options


@flow(name="pbt-benchmark", log_prints=True, retries=2, retry_delay_seconds=10)
def pbt_benchmark_flow(
    storage: str = "./results",
    name: str = "pbt_benchmark",
    seed: int = 0,
    smoke_test: bool = False,
    synch: bool = False,
    resume: str = "auto",
    max_rounds: int | None = None,
    credentials_block: str | None = None,
    plots: bool = True,
) -> State:
    """The benchmark as a flow run; its ``tune`` flow runs as a subflow.

    ``max_rounds``: advance the experiment by at most so many rounds per run (a
    scheduled deployment trains a budget at a time); ``name`` may be a template
    such as ``pbt_{date}`` (a fresh experiment per day); ``credentials_block``: a
    prefect-aws block's name, ``aws-credentials/NAME`` (or ``NAME``) or
    ``s3-bucket/NAME``, whose credentials open an ``s3://`` ``storage``; ``plots``:
    draw the plots at the end, onto the Artifacts page (needs ``popflow[plots]``).
    A mistake in the parameters fails the run without retries (they cannot mend it)."""
    with mistakes_not_retried():
        results = run_benchmark(
            storage=storage,
            name=name,
            seed=seed,
            smoke_test=smoke_test,
            synch=synch,
            resume=resume,
            max_rounds=max_rounds,
            credentials_block=credentials_block,
        )
    best = results.get_best_result()
    print(f"best config {best.config}, mean_accuracy {best.metrics['mean_accuracy']:.1f}")
    summary = {
        "config": best.config,
        "metrics": {"mean_accuracy": best.metrics["mean_accuracy"]},
        "finished": all(r.status in ("TERMINATED", "ERROR") for r in results),
    }
    if plots:
        path = results.experiment_path
        name = path.rstrip("/").rsplit("/", 1)[-1]
        plots_artifact(name, path, resolve_storage_options(storage, None, credentials_block))
    # the run's final state says how it ended (finished, budget spent, nothing to run)
    return Completed(message=results.summary, data=summary)


USAGE = """\
pbt_benchmark_flow.py defines the Prefect flow 'pbt-benchmark' that prefect.yaml deploys
(the PBT benchmark of pbt_benchmark.py; each run resumes the experiment of its name).
To deploy it, from the repository's root, on a Prefect server (PREFECT_API_URL; see
docs/tutorials/deploying.md):

    eval "$(popflow server start)"
    prefect work-pool create popflow-local --type process
    prefect deploy --name pbt-benchmark-smoke
    prefect worker start --pool popflow-local
    prefect deployment run pbt-benchmark/pbt-benchmark-smoke

Or run the flow once, here, without a deployment:

    python examples/pbt_benchmark_flow.py --run --smoke-test

To run the benchmark itself without Prefect's deployment: python examples/pbt_benchmark.py"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", action="store_true", help="run the flow once, here")
    parser.add_argument("--smoke-test", action="store_true", help="2 workers, 10 iterations")
    parser.add_argument("--storage", default="./results", help="local folder or fsspec URL")
    args = parser.parse_args(argv)
    if not args.run:
        print(USAGE)
        return
    # This flow run and its `tune` subflow on one server: popflow's local one unless
    # PREFECT_API_URL names another (else Prefect starts a temporary server for this one)
    with prefect_api():
        state = pbt_benchmark_flow(
            storage=args.storage, smoke_test=args.smoke_test, return_state=True
        )
    print(state.message)
    sys.exit(0 if state.is_completed() else 1)


if __name__ == "__main__":
    main()
