"""What ``popflow status`` prints: an experiment's state, its trials and the best one."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

from popflow.flows.experiment.reading import CommittedExperiment, ExperimentState
from popflow.flows.experiment.results import Result, ResultGrid, committed_results, flatten


def value_text(x: Any) -> str:
    """A metric or hyperparameter value, short."""
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def compact_config(config: Mapping[str, Any]) -> str:
    """``lr=0.01 opt=adam model/width=64``: a config on one line.

    >>> compact_config({"lr": 0.0123456, "opt": "adam", "model": {"width": 64}})
    'lr=0.0123456 opt=adam model/width=64'
    """
    return " ".join(f"{k}={value_text(v)}" for k, v in flatten(dict(config)).items())


def _fit(line: str, width: int) -> str:
    """``line`` cut to ``width`` characters, an ellipsis marking the cut."""
    return line if len(line) <= width else line[: max(width - 1, 0)] + "…"


def _best(grid: ResultGrid) -> Result | None:
    """The best trial so far by the run's metric and mode; None if none can be ranked."""
    try:
        return grid.get_best_result()
    except (ValueError, RuntimeError):  # no metric/mode, or nothing reported yet
        return None


def status_lines(
    experiment: CommittedExperiment,
    state: ExperimentState,
    driver: Mapping[str, Any] | None,
    width: int,
    resume_command: str,
) -> list[str]:
    """What ``popflow status`` prints: the experiment, one line per trial, the best trial.

    A trial shows its committed status, except that with no live driver a
    trial committed RUNNING shows PENDING: its segment's result was never
    committed, and a resume runs it again from its last checkpoint (as
    ``ResultGrid.from_path`` and the grid ``popflow.run`` returned show it).
    """
    grid = committed_results(experiment)
    metric, mode = experiment.metric, experiment.mode
    ranked = f"metric {metric} ({mode})" if metric and mode else "no metric/mode"
    lines = [
        f"{experiment.name}: {state}, {experiment.round} "
        f"round{'' if experiment.round == 1 else 's'} committed, "
        f"{experiment.scheduler or 'unknown scheduler'}, {ranked}"
    ]
    if state is ExperimentState.RUNNING and driver is not None:
        until = time.strftime("%H:%M:%S", time.localtime(float(driver.get("expires", 0))))
        lines.append(
            f"driver: pid {driver.get('pid')} on {driver.get('host')}, lease held until {until}"
        )
    elif state is ExperimentState.INTERRUPTED:
        lines.append(f"resume with: {resume_command}")
    if state is ExperimentState.RUNNING:
        statuses = [str(t["status"]) for t in experiment.commit["trials"]]
    else:
        statuses = [r.status for r in grid]
    counts = Counter(statuses)
    lines.append(f"{len(grid)} trials: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    best = _best(grid)
    rows = [
        (
            "*" if best is not None and r is best else " ",
            r.trial_id,
            status,
            value_text(r.metrics.get("training_iteration", "-")),
            value_text(r.metrics[metric]) if metric and metric in r.metrics else "-",
            compact_config(r.config),
        )
        for r, status in zip(grid, statuses, strict=True)
    ]
    header = (" ", "trial", "status", "iter", metric or "metric", "config")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(5)]
    for row in [header, *rows]:
        mark, trial_id, status, iteration, value, config = row
        line = (
            f"{mark} {trial_id:<{widths[1]}}  {status:<{widths[2]}}  "
            f"{iteration:>{widths[3]}}  {value:>{widths[4]}}  {config}"
        )
        lines.append(_fit(line.rstrip(), width))
    if best is not None:
        lines.append(f"best: {best.trial_id}, {metric} {value_text(best.metrics[metric])}")
        checkpoint = best.checkpoint.path if best.checkpoint is not None else "none (not saved)"
        lines.append(f"best checkpoint: {checkpoint}")
    return lines
