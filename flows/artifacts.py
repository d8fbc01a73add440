"""The run on the Prefect UI's Artifacts page: a leaderboard and a progress bar, updated
each round, and a summary when the run ends.

Artifacts are keyed by experiment (``<name>-leaderboard``, ``<name>-progress``,
``<name>-summary``), so they version across rounds and across the runs that
resume one experiment. They are sent from a thread of their own, in order and
in the round task's context (so the UI links them to it), off the round's path:
a synchronous round does not wait for Prefect's API. Prefect is told, never
relied on: storage is the truth, so trouble with its API is logged and the
training goes on.
"""

from __future__ import annotations

import contextvars
import heapq
import json
import logging
import math
import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from popflow.flows.trial_table import TrialRecord

logger = logging.getLogger(__name__)

#: Leaderboard rows kept, best first: the UI pages a long table, and each round sends it.
MAX_ROWS = 50


def artifact_key(experiment: str, what: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) for ``experiment``.

    >>> artifact_key("PBT_benchmark 2026-12-01", "leaderboard")
    'pbt-benchmark-2026-12-01-leaderboard'
    """
    base = re.sub(r"[^a-z0-9]+", "-", experiment.lower()).strip("-") or "experiment"
    return f"{base}-{what}"


def _score(value: Any, mode: str | None) -> float:
    """A sort key: best first, trials without a number last."""
    if not isinstance(value, int | float) or isinstance(value, bool) or math.isnan(value):
        return math.inf
    return -value if mode == "max" else value


def leaderboard(
    records: Sequence[TrialRecord], metric: str | None, mode: str | None
) -> list[dict[str, Any]]:
    """A row per trial, best first (at most ``MAX_ROWS``): trial, status, iteration, the
    metric and the config (only the rows kept are built: this runs every round)."""
    if metric:  # the best MAX_ROWS, in a pass (a full sort of 10,000 trials each round cost)
        ranked = heapq.nsmallest(
            MAX_ROWS,
            records,
            key=lambda rec: _score((rec.trial.last_result or {}).get(metric), mode),
        )
    else:
        ranked = list(records[:MAX_ROWS])
    rows = []
    for rec in ranked:
        last = rec.trial.last_result or {}
        row: dict[str, Any] = {
            "trial": rec.trial_id,
            "status": rec.trial.status.value,
            "iteration": last.get("training_iteration", 0),
        }
        if metric:
            row[metric] = last.get(metric)
        row["config"] = json.dumps(rec.trial.config, default=str, sort_keys=True)
        rows.append(row)
    return rows


def finished_percent(trials: int, live: int) -> float:
    """The share of ``trials`` that have ended (``live`` have not), in percent."""
    if not trials:
        return 100.0
    return 100.0 * (trials - live) / trials


class RunArtifacts:
    """One run's artifacts: :meth:`round_rows` after each committed round, :meth:`final_text`
    once."""

    def __init__(self, experiment: str, metric: str | None, mode: str | None) -> None:
        self.experiment = experiment
        self.metric = metric
        self.mode = mode
        self._progress: Any = None  # the progress artifact's id, once made
        self._sender = ThreadPoolExecutor(1, thread_name_prefix="popflow-artifacts")
        self._sent: list[Future[None]] = []
        #: the newest round's rows not yet sent: a record behind the training sends the
        #: latest leaderboard, not one per round it missed (57 of them took 14 s under load)
        self._latest: tuple[list[dict[str, Any]], float, int] | None = None
        self._latest_lock = threading.Lock()

    def _send(self, call: Callable[[], None]) -> None:
        """Run ``call`` on the sender thread, in this thread's context (the run's)."""
        context = contextvars.copy_context()

        def guarded() -> None:
            try:
                context.run(call)
            except Exception as e:  # the API is not the truth; storage is
                logger.warning("could not update the run's artifacts: %s", e)

        self._sent.append(self._sender.submit(guarded))

    def round_rows(self, rows: list[dict[str, Any]], done: float, round_no: int) -> None:
        """The leaderboard's next version (``rows``, :func:`leaderboard`'s) and the progress
        (``done``, :func:`finished_percent`'s), after round ``round_no``; when rounds come
        faster than the API takes them, only the newest is sent."""
        with self._latest_lock:
            waiting, self._latest = self._latest is not None, (rows, done, round_no)
        if not waiting:
            self._send(self._send_latest)

    def _send_latest(self) -> None:
        with self._latest_lock:
            latest, self._latest = self._latest, None
        if latest is not None:
            self._send_round(*latest)

    def _send_round(self, rows: list[dict[str, Any]], done: float, round_no: int) -> None:
        from prefect.artifacts import (
            create_progress_artifact,
            create_table_artifact,
            update_progress_artifact,
        )

        create_table_artifact(
            rows,
            key=artifact_key(self.experiment, "leaderboard"),
            description=f"{self.experiment} after round {round_no}, best first",
        )
        what = f"{self.experiment}: trials ended, round {round_no}"
        if self._progress is None:
            self._progress = create_progress_artifact(
                done, key=artifact_key(self.experiment, "progress"), description=what
            )
        else:
            update_progress_artifact(self._progress, done, description=what)

    def final_text(self, text: str, how: str) -> None:
        """The summary (:func:`summary_markdown`'s ``text``; ``how`` the run ended), after
        everything sent before it; returns once all is sent."""
        from prefect.artifacts import create_markdown_artifact

        key = artifact_key(self.experiment, "summary")
        self._send(lambda: create_markdown_artifact(text, key=key, description=how))
        self.flush()
        self._sender.shutdown()

    def flush(self) -> None:
        """Wait until everything sent so far has reached Prefect (or failed to)."""
        sent, self._sent = self._sent, []
        wait(sent)


def summary_markdown(
    grid: Any, how: str, records: Sequence[TrialRecord], metric: str | None, mode: str | None
) -> str:
    """The summary artifact's text."""
    statuses: dict[str, int] = {}
    for rec in records:
        statuses[rec.trial.status.value] = statuses.get(rec.trial.status.value, 0) + 1
    exploits = sum(rec.generation for rec in records)
    lines = [
        f"# {how}",
        "",
        f"Experiment: `{grid.experiment_path}`",
        "",
        "| trials | " + " | ".join(s.lower() for s in sorted(statuses)) + " | exploits |",
        "|---|" + "---|" * len(statuses) + "---|",
        f"| {len(records)} | "
        + " | ".join(str(statuses[s]) for s in sorted(statuses))
        + f" | {exploits} |",
        "",
    ]
    if metric and mode:
        try:
            best = grid.get_best_result(metric, mode)
        except (RuntimeError, ValueError):
            best = None
        if best is not None:
            lines += [
                f"**Best {metric}**: {best.metrics.get(metric)} "
                f"(iteration {best.metrics.get('training_iteration')})",
                "",
                f"**Best config**: `{json.dumps(best.config, default=str, sort_keys=True)}`",
                "",
                f"**Checkpoint**: `{best.checkpoint.path if best.checkpoint else 'none'}`",
                "",
            ]
    lines.append(f"Plots: `popflow plot {grid.experiment_path}`")
    return "\n".join(lines)


def plots_artifact(
    experiment: str, path: str, storage_options: dict[str, Any] | None = None
) -> list[str]:
    """Draw the experiment's plots (:func:`popflow.flows.plots.plot_experiment`) and show
    them on the Artifacts page: a markdown artifact ``<name>-plots`` with each PNG
    embedded (a data URI: the browser showing the UI need not reach the storage) and its
    path. Needs the ``plots`` extra; without it, or if drawing fails, a warning and
    nothing else (the run's result stands). The PNGs' paths."""
    import base64

    from prefect.artifacts import create_markdown_artifact

    from popflow.flows.plots import PlotsUnavailable, plot_experiment
    from popflow.infra.storage import Storage

    try:
        paths = plot_experiment(path, storage_options)
    except PlotsUnavailable as e:
        logger.warning("no plots for %s: %s", experiment, e)
        return []
    except Exception as e:  # a plot is a view: its failure never fails the run
        logger.warning("could not draw the plots of %s: %s: %s", experiment, type(e).__name__, e)
        return []
    lines = [f"# {experiment}: plots", ""]
    for url in paths:
        folder, name = url.rsplit("/", 1)
        png = Storage(folder, storage_options).read_bytes(name)
        lines += [
            f"![{name}](data:image/png;base64,{base64.b64encode(png).decode()})",
            "",
            f"`{url}`",
            "",
        ]
    try:
        create_markdown_artifact(
            "\n".join(lines), key=artifact_key(experiment, "plots"), description=experiment
        )
    except Exception as e:  # Prefect is told, never relied on
        logger.warning("could not send the plots of %s to Prefect: %s", experiment, e)
    return paths
