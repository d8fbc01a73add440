"""The run on the Prefect UI's Artifacts page: a leaderboard and a progress bar, updated
each round, the plots, redrawn while the run goes, and a summary when the run ends.

Artifacts are keyed by experiment (``<name>-leaderboard``, ``<name>-progress``,
``<name>-plots``, ``<name>-summary``), so they version across rounds and across
the runs that resume one experiment, and the key's page in the UI shows the
latest version. The leaderboard has the console's columns and rounding: trial,
status (``stopped early`` apart from ``finished``), the metric, iteration, time,
a column per hyperparameter; every round gets its leaderboard version (unless the
API falls ``MAX_BACKLOG`` rounds behind: the oldest waiting are then skipped, the
last round's never). They are sent from a thread of their own, in order
and in the round task's context (so the UI links them to it), off the round's
path: a synchronous round does not wait for Prefect's API. The plots are drawn
on another thread, at most every ``PLOTS_INTERVAL_S``, so a round never waits
for a drawing either. Prefect is told, never relied on: storage is the truth, so
trouble with its API is logged and the training goes on.
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

from popflow.flows.experiment.results import flatten
from popflow.flows.experiment.trial_table import TrialRecord, stopped_early
from popflow.schedulers import TrialStatus
from popflow.schedulers.rounding import human  # the console's rounding

logger = logging.getLogger(__name__)

#: Leaderboard rows kept, best first: the UI pages a long table, and each round sends it.
MAX_ROWS = 50
#: Rounds whose leaderboard may wait for Prefect's API; past it the oldest are skipped
#: (a run of many quick rounds on a slow API would otherwise end waiting seconds for them).
MAX_BACKLOG = 32
#: The leaderboard's status of a trial that ended before the others got as far.
STOPPED_EARLY = "stopped early"


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


def _iteration(rec: TrialRecord) -> float:
    value = (rec.trial.last_result or {}).get("training_iteration", 0)
    return float(value) if isinstance(value, int | float) else 0.0


def status_label(rec: TrialRecord, horizon: float) -> str:
    """What the leaderboard says of ``rec``: ``finished``, ``stopped early``, ``error``,
    ``running``..."""
    status = rec.trial.status
    if status != TrialStatus.TERMINATED:
        return status.value.lower()
    done = (rec.trial.last_result or {}).get("done") is True
    return (
        STOPPED_EARLY
        if not done and stopped_early(status, _iteration(rec), horizon)
        else ("finished")
    )


def _varying(configs: Sequence[dict[str, Any]]) -> list[str]:
    """The (flattened) config keys whose values differ between the rows (all, for one)."""
    values: dict[str, set[str]] = {}
    for config in configs:
        for key, value in config.items():
            values.setdefault(key, set()).add(repr(value))
    varying = [k for k, seen in values.items() if len(seen) > 1]
    return varying if varying or len(configs) > 1 else list(values)


def leaderboard(
    records: Sequence[TrialRecord], metric: str | None, mode: str | None
) -> list[dict[str, Any]]:
    """A row per trial, best first (at most ``MAX_ROWS``): trial, status, the metric,
    iteration, total time and a column per hyperparameter that varies, numbers rounded as
    the console rounds them (only the rows kept are built: this runs every round)."""
    if metric:  # the best MAX_ROWS, in a pass (a full sort of 10,000 trials each round cost)
        ranked = heapq.nsmallest(
            MAX_ROWS,
            records,
            key=lambda rec: _score((rec.trial.last_result or {}).get(metric), mode),
        )
    else:
        ranked = list(records[:MAX_ROWS])
    horizon = max((_iteration(rec) for rec in records), default=0.0)
    configs = [flatten(rec.trial.config) for rec in ranked]
    params = _varying(configs)
    rows = []
    for rec, config in zip(ranked, configs, strict=True):
        last = rec.trial.last_result or {}
        row: dict[str, Any] = {"trial": rec.trial_id, "status": status_label(rec, horizon)}
        if metric:
            row[metric] = human(last.get(metric))
        row["iter"] = human(last.get("training_iteration"))
        seconds = last.get("time_total_s")
        row["total time (s)"] = human(round(seconds, 2)) if isinstance(seconds, int | float) else ""
        row.update({key: human(config.get(key)) for key in params})
        rows.append(row)
    return rows


def progress_text(records: Sequence[TrialRecord], metric: str | None, mode: str | None) -> str:
    """The progress artifact's line: trials ended and the best result so far."""
    ended = sum(1 for rec in records if not rec.trial.is_live)
    text = f"{ended} of {len(records)} trials ended"
    best = best_text(records, metric, mode)
    return f"{text}; {best}" if best else text


def best_text(records: Sequence[TrialRecord], metric: str | None, mode: str | None) -> str:
    """``best <metric> <value> (trial <id>, iter <n>)`` of the best result so far ("" if
    none has the metric)."""
    if not metric:
        return ""
    best = min(
        records,
        key=lambda rec: _score((rec.trial.last_result or {}).get(metric), mode),
        default=None,
    )
    last = best.trial.last_result or {} if best is not None else {}
    if best is None or _score(last.get(metric), mode) == math.inf:
        return ""
    return (
        f"best {metric} {human(last.get(metric))} "
        f"(trial {best.trial_id}, iter {last.get('training_iteration')})"
    )


def finished_percent(trials: int, live: int) -> float:
    """The share of ``trials`` that have ended (``live`` have not), in percent."""
    if not trials:
        return 100.0
    return 100.0 * (trials - live) / trials


class RunArtifacts:
    """One run's artifacts: :meth:`round_rows` after each committed round, :meth:`final_text`
    once. ``plots``: the plots' :class:`~popflow.flows.record.plot_artifacts.PlotRefresh`,
    told after each round (None: no plots while the run goes)."""

    def __init__(
        self,
        experiment: str,
        metric: str | None,
        mode: str | None,
        plots: Any = None,
    ) -> None:
        self.experiment = experiment
        self.metric = metric
        self.mode = mode
        self._progress: Any = None  # the progress artifact's id, once made
        self._sender = ThreadPoolExecutor(1, thread_name_prefix="popflow-artifacts")
        self._sent: list[Future[None]] = []
        self.plots = plots
        #: the rounds not yet sent, oldest first: each gets its leaderboard version; a
        #: record more than MAX_BACKLOG rounds behind skips the oldest (not the newest)
        self._waiting: list[tuple[list[dict[str, Any]], float, int, str]] = []
        self._waiting_lock = threading.Lock()
        self.skipped = 0  # rounds whose leaderboard was skipped, as the API fell behind

    def _send(self, call: Callable[[], None]) -> None:
        """Run ``call`` on the sender thread, in this thread's context (the run's)."""
        context = contextvars.copy_context()

        def guarded() -> None:
            try:
                context.run(call)
            except Exception as e:  # the API is not the truth; storage is
                logger.warning("could not update the run's artifacts: %s", e)

        self._sent.append(self._sender.submit(guarded))

    def round_rows(
        self, rows: list[dict[str, Any]], done: float, round_no: int, progress: str = ""
    ) -> None:
        """The leaderboard's next version (``rows``, :func:`leaderboard`'s), the progress
        (``done``, :func:`finished_percent`'s; ``progress``, :func:`progress_text`'s) after
        round ``round_no``, and the plots if a drawing is due. Each round gets its
        leaderboard version; rounds that wait for the API together are sent in one go
        (the progress once, the newest); beyond ``MAX_BACKLOG`` waiting, the oldest are
        skipped, never the newest."""
        with self._waiting_lock:
            idle = not self._waiting
            self._waiting.append((rows, done, round_no, progress))
            if len(self._waiting) > MAX_BACKLOG:
                self.skipped += len(self._waiting) - MAX_BACKLOG
                del self._waiting[: len(self._waiting) - MAX_BACKLOG]
        if idle:
            self._send(self._send_waiting)
        if self.plots is not None:
            self.plots.due()

    def _send_waiting(self) -> None:
        from prefect.artifacts import create_table_artifact

        with self._waiting_lock:
            waiting, self._waiting = self._waiting, []
        for rows, _, round_no, _ in waiting:
            create_table_artifact(
                rows,
                key=artifact_key(self.experiment, "leaderboard"),
                description=f"{self.experiment} after round {round_no}, best first",
            )
        if waiting:
            self._send_progress(*waiting[-1][1:])

    def _send_progress(self, done: float, round_no: int, progress: str) -> None:
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        what = f"{self.experiment}, round {round_no}: {progress or 'trials ended'}"
        if self._progress is None:
            self._progress = create_progress_artifact(
                done, key=artifact_key(self.experiment, "progress"), description=what
            )
        else:
            update_progress_artifact(self._progress, done, description=what)

    def final_text(self, text: str, how: str) -> None:
        """The summary (:func:`summary_markdown`'s ``text``; ``how`` the run ended), after
        everything sent before it, and the last plots; returns once all is sent."""
        from prefect.artifacts import create_markdown_artifact

        key = artifact_key(self.experiment, "summary")
        self._send(lambda: create_markdown_artifact(text, key=key, description=how))
        self.flush()
        self._sender.shutdown()
        if self.plots is not None:
            self.plots.close(final=True)

    def flush(self) -> None:
        """Wait until everything sent so far has reached Prefect (or failed to)."""
        sent, self._sent = self._sent, []
        wait(sent)


def summary_markdown(
    grid: Any,
    how: str,
    records: Sequence[TrialRecord],
    metric: str | None,
    mode: str | None,
    population: bool = False,
) -> str:
    """The summary artifact's text: trials by status (stopped early apart from finished),
    exploits for a PBT-family run (``population``), the best result and config."""
    horizon = max((_iteration(rec) for rec in records), default=0.0)
    statuses: dict[str, int] = {}
    for rec in records:
        label = status_label(rec, horizon)
        statuses[label] = statuses.get(label, 0) + 1
    columns = [(s, str(statuses[s])) for s in sorted(statuses)]
    if population:
        columns.append(("exploits", str(sum(rec.generation for rec in records))))
    lines = [
        f"# {how}",
        "",
        f"Experiment: `{grid.experiment_path}`",
        "",
        "| trials | " + " | ".join(name for name, _ in columns) + " |",
        "|---|" + "---|" * len(columns),
        f"| {len(records)} | " + " | ".join(n for _, n in columns) + " |",
        "",
    ]
    if metric and mode:
        try:
            best = grid.get_best_result(metric, mode)
        except (RuntimeError, ValueError):
            best = None
        if best is not None:
            lines += [
                f"**Best {metric}**: {human(best.metrics.get(metric))} "
                f"(trial {best.trial_id}, iteration {best.metrics.get('training_iteration')})",
                "",
                f"**Best config**: `{json.dumps(best.config, default=str, sort_keys=True)}`",
                "",
                f"**Checkpoint**: `{best.checkpoint.path if best.checkpoint else 'none'}`",
                "",
            ]
    lines.append(f"Plots: `popflow plot {grid.experiment_path}`")
    return "\n".join(lines)
