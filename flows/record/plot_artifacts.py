"""The plots on the Prefect UI's Artifacts page (``<name>-plots``): redrawn while a run
goes, by :class:`PlotRefresh` (a thread of its own, at most every
``PLOTS_INTERVAL_S``: a round never waits for a drawing), and once more when every
run ends; drawn at the end of a deployment that asks for them (:func:`plots_artifact`). Each PNG is embedded as a
data URI, so the browser showing the UI need not reach the storage. A plot is a
view: without matplotlib, or if drawing fails, the run goes on.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

logger = logging.getLogger(__name__)

#: Seconds between two drawings of the plots artifact while a run goes.
PLOTS_INTERVAL_S = 60.0


class PlotRefresh:
    """The plots artifact, redrawn while a run goes: :meth:`due` after each round starts a
    drawing on a thread of its own when ``interval_s`` has passed since the run started
    or since the last drawing began, and none is under way; it never waits for one.
    :meth:`close` draws the last version, so every run ends with one. ``draw`` (default
    :func:`draw_plots_artifact`) sends one version; False: it cannot (no matplotlib), and
    the refresh stops. ``warm`` (default :func:`warm_plots`) runs first on the drawing's
    thread, while the run trains: the end's drawing does not pay matplotlib's import."""

    def __init__(
        self,
        experiment: str,
        path: str,
        storage_options: dict[str, Any] | None,
        interval_s: float | None = None,
        draw: Callable[[str, str, dict[str, Any] | None], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
        warm: Callable[[], None] | None = None,
    ) -> None:
        self.experiment, self.path, self.storage_options = experiment, path, storage_options
        self.interval_s = PLOTS_INTERVAL_S if interval_s is None else interval_s
        self._draw = draw or draw_plots_artifact
        self._clock = clock
        self._last = clock()
        self._busy = threading.Lock()
        self._drawn = 0  # versions sent
        self._off = False
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="popflow-plots")
        self._future: Future[None] | None = None
        self._thread.submit(contextvars.copy_context().run, warm or warm_plots)

    @property
    def drawn(self) -> int:
        return self._drawn

    def due(self) -> None:
        """A round ended: start a drawing if one is due (returns at once)."""
        now = self._clock()
        if self._off or now - self._last < self.interval_s or not self._busy.acquire(False):
            return
        self._last = now
        context = contextvars.copy_context()
        self._future = self._thread.submit(context.run, self._run)

    def _run(self) -> None:
        try:
            if self._draw(self.experiment, self.path, self.storage_options):
                self._drawn += 1
            else:
                self._off = True
        except Exception as e:  # a plot is a view: its failure never fails the run
            logger.warning("could not draw the plots of %s: %s: %s", self.experiment, type(e), e)
        finally:
            self._busy.release()

    def close(self, final: bool) -> None:
        """The run ended: wait for a drawing under way; with ``final``, draw the last
        version (every run ends with its plots: the artifact's page shows the end, not a
        minute before it, and a run shorter than ``interval_s`` has them too)."""
        if self._future is not None:
            wait([self._future])
        if final and not self._off and self._busy.acquire(False):
            self._run()
        self._thread.shutdown()


def warm_plots() -> None:
    """Import matplotlib's drawing parts and load its fonts with a tiny drawing (most of a
    first drawing's time), off the run's path; nothing without matplotlib (the drawing
    says so)."""
    import io

    from popflow.flows.plots.figures import PlotsUnavailable, _matplotlib

    try:
        _, figure, canvas = _matplotlib()
        tiny = figure(figsize=(1, 1), dpi=10)
        canvas(tiny)
        tiny.add_subplot().set_title("warm")
        tiny.savefig(io.BytesIO(), format="png")
    except PlotsUnavailable:
        pass
    except Exception as e:  # a plot is a view: its failure never fails the run
        logger.debug("matplotlib failed to import: %s", e)


def _plots_markdown(experiment: str, pngs: Sequence[tuple[str, bytes, str]]) -> str:
    """The plots artifact: each PNG embedded (a data URI: the browser showing the UI need
    not reach the storage), under its name and where it lies (``pngs``: name, bytes,
    where)."""
    import base64

    lines = [f"# {experiment}: plots", ""]
    for name, png, where in pngs:
        lines += [f"![{name}](data:image/png;base64,{base64.b64encode(png).decode()})", ""]
        lines += [f"`{where}`", ""]
    return "\n".join(lines)


def draw_plots_artifact(
    experiment: str, path: str, storage_options: dict[str, Any] | None = None
) -> bool:
    """Draw the running experiment's plots in memory (nothing is written to its storage)
    and send them as the ``<name>-plots`` artifact's next version. False without
    matplotlib."""
    from prefect.artifacts import create_markdown_artifact

    from popflow.flows.plots.data import plot_data
    from popflow.flows.plots.figures import PlotsUnavailable, _matplotlib, render
    from popflow.flows.plots.reading import read_experiment
    from popflow.flows.record.artifacts import artifact_key

    try:
        _matplotlib()
    except PlotsUnavailable:
        logger.debug("no live plots of %s: matplotlib is not installed", experiment)
        return False
    snapshot = read_experiment(path, storage_options)
    pngs = render(plot_data(snapshot))
    where = f"as of round {snapshot.round}; `popflow plot {path}` writes them"
    text = _plots_markdown(experiment, [(n, png, where) for n, png in pngs.items()])
    create_markdown_artifact(
        text, key=artifact_key(experiment, "plots"), description=f"{experiment}, {where}"
    )
    return True


def plots_artifact(
    experiment: str, path: str, storage_options: dict[str, Any] | None = None
) -> list[str]:
    """Draw the experiment's plots (:func:`popflow.flows.plots.figures.plot_experiment`) and show
    them on the Artifacts page: a markdown artifact ``<name>-plots`` with each PNG
    embedded and its path. Needs the ``plots`` extra; without it, or if drawing fails, a
    warning and nothing else (the run's result stands). The PNGs' paths."""
    from prefect.artifacts import create_markdown_artifact

    from popflow.flows.plots.figures import PlotsUnavailable, plot_experiment
    from popflow.flows.record.artifacts import artifact_key
    from popflow.infra.storage.folder import Storage

    try:
        paths = plot_experiment(path, storage_options)
    except PlotsUnavailable as e:
        logger.warning("no plots for %s: %s", experiment, e)
        return []
    except Exception as e:  # a plot is a view: its failure never fails the run
        logger.warning("could not draw the plots of %s: %s: %s", experiment, type(e).__name__, e)
        return []
    pngs = []
    for url in paths:
        folder, name = url.rsplit("/", 1)
        pngs.append((name, Storage(folder, storage_options).read_bytes(name), url))
    try:
        create_markdown_artifact(
            _plots_markdown(experiment, pngs),
            key=artifact_key(experiment, "plots"),
            description=experiment,
        )
    except Exception as e:  # Prefect is told, never relied on
        logger.warning("could not send the plots of %s to Prefect: %s", experiment, e)
    return paths
