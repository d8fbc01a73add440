"""Plots of an experiment in storage: a PBT schedule, or early stopping's rungs and stops.

popflow's own readers give the data: the latest commit (:class:`ExperimentLog`)
gives the trial table and scheduler state, the trials' committed ``result.json``
lines make a :class:`~popflow.flows.experiment.results.ResultGrid`, and PBT's exploits
come from ``pbt_global.txt`` (Ray's line: target tag, source tag, target and
source ``training_iteration``, the source's config, the new config). Nothing
is written but the PNGs, so a running experiment can be plotted as it goes.

- PBT, PB2 (and PBT replay): one panel per mutated hyperparameter (a config
  key that changes over time; a categorical axis for values picked from a list)
  and one of the metric, against ``time_attr``; one faint line per trial, broken
  at each exploit, a dashed link from the source's point to the clone's first
  point (a triangle), and in bold the best trial's lineage: the path through the
  exploits that led to its last result, so its config schedule reads as one line.
- ASHA, HyperBand, median stopping, FIFO: the metric per trial against
  ``time_attr``, the best trial bold, rungs as vertical lines (ASHA's milestones
  ``r·η^k`` from the scheduler's committed state; otherwise inferred from where
  trials stopped), a cross at the last point of each trial stopped early;
  ``log_y`` puts the metric on a log scale.

Lines are drawn as one collection per panel, not one artist per segment, so a
run with thousands of segments draws quickly.

:func:`~popflow.flows.plots.data.plot_data` is the pure part (experiment in,
series out, in :mod:`popflow.flows.plots.data`; read by :mod:`popflow.flows.plots.reading`);
:func:`render` draws it with
matplotlib's Agg canvas (no pyplot, no global backend change).

>>> from popflow.flows.plots.figures import plot_experiment  # doctest: +SKIP
>>> plot_experiment("./results/pbt_demo")            # doctest: +SKIP
['/abs/results/pbt_demo/plots/population.png']
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import fsspec

from popflow.flows.plots.data import PlotData, PlotKind, plot_data
from popflow.flows.plots.reading import read_experiment
from popflow.infra.storage.folder import Storage
from popflow.schedulers import TrialStatus

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["DPI", "PlotsUnavailable", "figure", "figure_size_px", "plot_experiment", "render"]

PLOTS_DIR = "plots"
#: The figures' resolution and size: WIDTH_PX wide, TITLE_PX plus PANEL_PX per panel
#: (SINGLE_PANEL_PX for a figure of one panel).
DPI = 100
WIDTH_PX = 1400
PANEL_PX = 380
SINGLE_PANEL_PX = 560
TITLE_PX = 70
#: Trials named one by one in the legend; more are only counted.
MAX_LEGEND_TRIALS = 16


class PlotsUnavailable(ImportError):
    """matplotlib is not installed."""


# -- drawing -----------------------------------------------------------------------


def _matplotlib() -> Any:
    try:
        import matplotlib
        import matplotlib.ticker
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise PlotsUnavailable(
            f"plots need matplotlib ({e}): pip install 'popflow[plots]'"
        ) from None
    return matplotlib, Figure, FigureCanvasAgg


def figure_size_px(data: PlotData) -> tuple[int, int]:
    """(width, height) in pixels of the figure of ``data``."""
    n = len(data.panels)
    return WIDTH_PX, TITLE_PX + (SINGLE_PANEL_PX if n == 1 else PANEL_PX * n)


def _colors(matplotlib: Any, trials: Sequence[str]) -> dict[str, Any]:
    n = len(trials)
    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20" if n <= 20 else "viridis"]
    if n > 20:
        return {t: cmap(i / max(1, n - 1)) for i, t in enumerate(trials)}
    return {t: cmap(i) for i, t in enumerate(trials)}


def _title(data: PlotData) -> str:
    state = "finished" if data.finished else f"running, round {data.round}"
    what = f"{len(data.trials)} trials"
    if data.kind == PlotKind.POPULATION:
        what += f", {len(data.exploits)} exploits"
    else:
        stopped = sum(1 for s in data.stops if s.status == TrialStatus.TERMINATED)
        what += f", {stopped} stopped early"
    if data.errored:
        what += f", {data.errored} errored"
    return f"{data.name}: {data.scheduler or 'unknown scheduler'} ({what}; {state})"


def _empty_text(data: PlotData) -> str:
    """What a panel with no results says: why, when the trials errored."""
    if not data.errored:
        return "no results yet"
    text = f"{data.errored} of {len(data.trials)} trials errored"
    if data.first_error:
        reason = data.first_error
        text += f"; the first: {reason[:97] + '...' if len(reason) > 100 else reason}"
    return text


def _offsets(data: PlotData, key: str) -> dict[str, float]:
    """Each trial's small vertical shift on a categorical panel, so that trials with one
    value stay apart (within ±0.15 of the value's code); none on other panels."""
    n = len(data.trials)
    if key not in data.categories or n < 2:
        return dict.fromkeys(data.trials, 0.0)
    return {t: 0.3 * (i / (n - 1) - 0.5) for i, t in enumerate(data.trials)}


def _draw_traces(
    ax: Axes,
    data: PlotData,
    key: str,
    colors: Mapping[str, Any],
    offsets: Mapping[str, float],
) -> None:
    """Every trial's lines as one collection (thousands of lines draw in one call): faint
    where a best trial stands out, then the best one (PBT: its lineage) bold on top."""
    from matplotlib.collections import LineCollection

    traces = data.panels[key]
    faint = data.best is not None
    lines = [
        list(zip(t.times, [v + offsets[t.trial_id] for v in t.values], strict=True)) for t in traces
    ]
    ax.add_collection(
        LineCollection(
            lines,
            colors=[colors[t.trial_id] for t in traces],
            linewidths=1.0 if faint else 1.6,
            alpha=(0.35 if data.kind == PlotKind.POPULATION else 0.5) if faint else 0.9,
        )
    )
    ax.autoscale_view()
    if data.best is None:
        return
    path = data.lineage.get(key)
    if data.kind == PlotKind.EARLY_STOPPING:
        best = [t for t in traces if t.trial_id == data.best]
        for t in best:
            ax.plot(t.times, t.values, color="black", lw=2.6, zorder=4)
    elif path is not None:
        ax.plot(path.times, path.values, color="black", lw=2.6, zorder=4)


def _draw_exploits(ax: Axes, data: PlotData, key: str, offsets: Mapping[str, float]) -> None:
    """Each exploit as a faint dashed line from the source's point to the clone's first,
    and a triangle there (hollow while the clone has not trained yet), in two artists."""
    from matplotlib.collections import LineCollection

    links, done, pending = [], [], []
    for e in data.exploits:
        (xs, ys), (xt, yt) = e.source_at, e.target_at
        if key not in ys or key not in yt:
            continue
        to = (xt, yt[key] + offsets[e.target])
        links.append([(xs, ys[key] + offsets[e.source]), to])
        (pending if e.pending else done).append(to)
    if not links:
        return
    ax.add_collection(
        LineCollection(links, colors="0.35", linewidths=0.8, linestyles="--", alpha=0.5)
    )
    for points, face in ((done, "0.6"), (pending, "white")):
        if points:
            xs, ys = zip(*points, strict=True)
            ax.scatter(xs, ys, marker="^", s=28, color=face, edgecolors="0.3", lw=0.5, zorder=3)


def _draw_rungs(ax: Axes, data: PlotData) -> None:
    times = [x for ts in data.panels.values() for t in ts for x in t.times]
    if not times:
        return
    lo, hi = min(times), max(times)
    for r in data.rungs:
        if lo <= r <= hi:
            ax.axvline(r, color="0.45", ls=":", lw=1.2, zorder=0)
            ax.annotate(
                f"rung {r:g}",
                xy=(r, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(2, -2),
                textcoords="offset points",
                ha="left",
                va="top",
                fontsize=9,
                color="0.3",
            )


def _draw_stops(ax: Axes, data: PlotData, colors: Mapping[str, Any]) -> None:
    """A cross at each stopped trial's last point; a red-edged one where a trial errored
    (one artist per kind)."""
    for status, style in (
        (TrialStatus.TERMINATED, {"marker": "x", "s": 60, "linewidths": 1.6}),
        (TrialStatus.ERROR, {"marker": "X", "s": 100, "edgecolors": "red", "linewidths": 1.0}),
    ):
        stops = [s for s in data.stops if s.status == status]
        if stops:
            ax.scatter(
                [s.time for s in stops],
                [s.value for s in stops],
                color=[colors[s.trial_id] for s in stops],
                zorder=5,
                **style,
            )


def _legend(fig: Figure, data: PlotData, colors: Mapping[str, Any]) -> None:
    from matplotlib.lines import Line2D

    def marker(label: str, **style: Any) -> Line2D:
        return Line2D([], [], ls="none", label=label, **style)

    handles: list[Any] = []
    if data.best is not None:
        what = "lineage" if data.kind == PlotKind.POPULATION and data.lineage else "trial"
        handles.append(Line2D([], [], color="black", lw=2.6, label=f"best {what}: {data.best}"))
    if len(data.trials) <= MAX_LEGEND_TRIALS:
        handles += [Line2D([], [], color=colors[t], lw=2, label=t) for t in data.trials]
    else:
        handles.append(Line2D([], [], color="none", label=f"{len(data.trials)} trials"))
    if data.exploits:
        handles += [
            Line2D([], [], color="0.35", lw=0.9, ls="--", label="cloned from (source → clone)"),
            marker("clone's first result", color="0.6", marker="^", ms=7, mec="0.2"),
        ]
    if any(e.pending for e in data.exploits):
        handles.append(
            marker("clone not trained yet (new config)", color="white", marker="^", ms=7, mec="0.2")
        )
    if data.rungs:
        label = "rung (inferred from stops)" if data.rungs_inferred else "rung (milestone)"
        handles.append(Line2D([], [], color="0.45", ls=":", lw=1.2, label=label))
    if any(s.status == TrialStatus.TERMINATED for s in data.stops):
        handles.append(marker("stopped early", color="0.3", marker="x", ms=8, mew=2))
    if any(s.status == TrialStatus.ERROR for s in data.stops):
        handles.append(marker("error", color="0.3", marker="X", ms=9, mec="red"))
    fig.legend(handles=handles, loc="outside right upper", fontsize=10, frameon=False)


def _format_axis(ax: Axes, data: PlotData, key: str, log_y: bool) -> None:
    values = [v for t in data.panels[key] for v in t.values]
    if key == data.metric:
        ax.set_ylabel(f"{key} ({data.mode})" if data.mode else key)
        ax.set_title(f"{key} per trial", loc="left", fontsize=11)
        if log_y and values:  # symlog where a value is 0 or below: log cannot show it
            ax.set_yscale("log" if min(values) > 0 else "symlog")
    else:
        ax.set_ylabel(key)
        ax.set_title(f"hyperparameter {key}", loc="left", fontsize=11)
    labels = data.categories.get(key)
    if labels:  # a categorical axis: a tick per value, no values between them
        ax.set_yticks(range(len(labels)), labels)
        ax.set_ylim(-0.5, len(labels) - 0.5)
    elif key != data.metric and values and min(values) > 0 and max(values) / min(values) >= 100:
        ax.set_yscale("log")  # a hyperparameter over decades (a learning rate)
    ax.grid(True, alpha=0.3)


def figure(data: PlotData, *, log_y: bool = False) -> Figure:
    """The figure of ``data`` on an Agg canvas (``log_y``: the metric on a log scale)."""
    matplotlib, Figure, FigureCanvasAgg = _matplotlib()
    width, height = figure_size_px(data)
    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    keys = [data.metric] + [k for k in data.panels if k != data.metric]
    if data.kind == PlotKind.POPULATION:  # the schedule on top, the outcome below
        keys = keys[1:] + keys[:1]
    axes = fig.subplots(len(keys), 1, sharex=True, squeeze=False)[:, 0]
    colors = _colors(matplotlib, data.trials)
    for ax, key in zip(axes, keys, strict=True):
        offsets = _offsets(data, key)
        _draw_traces(ax, data, key, colors, offsets)
        if data.kind == PlotKind.POPULATION:
            _draw_exploits(ax, data, key, offsets)
        else:
            _draw_rungs(ax, data)
            _draw_stops(ax, data, colors)
        _format_axis(ax, data, key, log_y)
        if not data.panels[key]:
            ax.text(0.5, 0.5, _empty_text(data), transform=ax.transAxes, ha="center")
    axes[-1].set_xlabel(data.time_attr)
    times = [x for traces in data.panels.values() for t in traces for x in t.times]
    if times and all(x == int(x) for x in times):  # iterations: no ticks between them
        axes[-1].xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    fig.suptitle(_title(data), fontsize=13)
    _legend(fig, data, colors)
    return fig


def render(data: PlotData, *, log_y: bool = False) -> dict[str, bytes]:
    """The PNGs of ``data`` by file name (``population.png`` or ``metric.png``);
    ``log_y``: the metric on a log scale."""
    matplotlib = _matplotlib()[0]
    with matplotlib.rc_context({"font.size": 11, "axes.titlesize": 11, "axes.labelsize": 11}):
        buf = io.BytesIO()
        figure(data, log_y=log_y).savefig(buf, format="png", dpi=DPI)
    name = "population.png" if data.kind == PlotKind.POPULATION else "metric.png"
    return {name: buf.getvalue()}


def _out_storage(
    experiment: str, out: str | os.PathLike[str] | None, storage_options: dict[str, Any] | None
) -> Storage:
    if out is None:
        return Storage(experiment, storage_options).child(PLOTS_DIR)
    out = os.fspath(out)
    same = fsspec.utils.get_protocol(out) == fsspec.utils.get_protocol(experiment)
    return Storage(out, storage_options if same else None)


def plot_experiment(
    path: str | os.PathLike[str],
    storage_options: dict[str, Any] | None = None,
    out: str | os.PathLike[str] | None = None,
    *,
    time_attr: str = "training_iteration",
    metric: str | None = None,
    log_y: bool = False,
) -> list[str]:
    """Draw the experiment at ``path`` (finished or running: its latest commit) as PNGs.

    ``out``: the folder to write them to (default ``<path>/plots/``; the
    experiment's ``storage_options`` apply to it if it uses the same protocol).
    ``log_y``: the metric on a log scale (a loss over decades). Returns the PNGs'
    paths (URLs on object stores). Raises
    :class:`NoExperiment` if nothing is committed at ``path``,
    :class:`PlotsUnavailable` without matplotlib.
    """
    _matplotlib()  # before any reading: say at once what to install
    path = os.fspath(path)
    data = plot_data(read_experiment(path, storage_options), time_attr=time_attr, metric=metric)
    target = _out_storage(path, out, storage_options)
    written = []
    for name, png in render(data, log_y=log_y).items():
        target.write_bytes(png, name)
        written.append(target.full_url(name))
    return written
