"""The console's view of a run: Ray Tune's "Trial status" table, drawn with rich.

On a terminal the table is redrawn in place (at most every ``TTY_REFRESH_S``),
with log lines printed above it; through a pipe or into a CI log, which keep
every print, the status line is printed every ``PLAIN_INTERVAL_S`` and the
table as plain text once, at the end. ``verbose``
is Ray's: 1 the status line only, 2 the table, 3 the table and a line per
result. The header names the experiment, its seed, the scheduler and the
Dask dashboard; the footer the best result and its checkpoint.

The driver calls it between results, from the thread that runs the rounds;
:meth:`LiveTable.tick` returns at once when no redraw is due, so it costs
nothing per result.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

from popflow.flows.console.live_results import LiveResults
from popflow.flows.events.run_events import Event, SegmentReturned, Tick, TrialResult
from popflow.flows.experiment.results import flatten
from popflow.flows.experiment.trial_table import TrialRecord
from popflow.schedulers import TrialStatus
from popflow.schedulers.rounding import human

if TYPE_CHECKING:
    from popflow.flows.experiment.results import ResultGrid

#: seconds between redraws on a terminal, and between plain prints otherwise
TTY_REFRESH_S = 2.0
PLAIN_INTERVAL_S = 30.0
#: Ray's ``max_progress_rows`` and a cap on hyperparameter columns
MAX_ROWS = 20
MAX_PARAM_COLUMNS = 6
#: the width of the plain table (a pipe has none of its own)
PLAIN_WIDTH = 200
#: result keys Ray fills in, never shown as a hyperparameter or metric column
_ORDER = (TrialStatus.RUNNING, TrialStatus.PAUSED, TrialStatus.PENDING)


def _elapsed(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


class LiveTable:
    """What a person watching the terminal sees while a run goes."""

    def __init__(
        self,
        verbose: int,
        *,
        name: str,
        path: str,
        seed: int,
        scheduler: str,
        metric: str | None,
        mode: str | None,
        file: IO[str] | None = None,
        interval_s: float | None = None,
        width: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``width``: the console's columns (default: the terminal's; a pipe's
        ``PLAIN_WIDTH``); ``clock``: seconds that never go back (when to redraw)."""
        self.clock = clock
        from rich.console import Console

        self.verbose = verbose
        self.name, self.path, self.seed, self.scheduler = name, path, seed, scheduler
        self.metric, self.mode = metric, mode
        self.console = Console(file=file or sys.stdout, highlight=False, soft_wrap=False)
        self.tty = self.console.is_terminal
        if width is not None:
            self.console.width = width
        elif not self.tty:  # a pipe or a CI log: no width to fit, so none of rich's 80
            self.console.width = PLAIN_WIDTH
        self.interval = interval_s or (TTY_REFRESH_S if self.tty else PLAIN_INTERVAL_S)
        self.dashboard: str | None = None
        self.round = 0
        self._t0 = self.clock()
        self._due = self._t0 + self.interval
        self._live: Any = None
        self._restore: list[tuple[Any, str, Any]] = []
        #: the running segments' latest results, sent as they train
        self.live = LiveResults()

    # -- the driver's calls ----------------------------------------------------
    def start(self, dashboard: str | None, client: Any = None) -> None:
        """The run started: on a terminal the live region opens under the header; the
        running segments' results come from ``client`` (a Dask client) as they train."""
        self.dashboard = dashboard
        if client is not None:
            self.live.subscribe(client)
        if not self.tty:
            self.console.print(self._header())
            return
        from rich.live import Live

        before = {id(sys.stdout), id(sys.stderr), id(sys.__stdout__), id(sys.__stderr__)}
        self._live = Live(
            self._header(),
            console=self.console,
            auto_refresh=False,
            redirect_stdout=True,
            redirect_stderr=True,
        )
        self._live.start()
        self._logs_above(before)

    def follow(self, event: Event) -> None:
        """The driver's events (:mod:`popflow.flows.events.run_events`) this table shows."""
        if isinstance(event, TrialResult):
            self.result(event.record, event.result)
        elif isinstance(event, SegmentReturned):
            self.live.reduced(event.trial_id)
        elif isinstance(event, Tick):
            self.tick(event.records, event.rounds)

    def tick(self, records: Sequence[TrialRecord], round_no: int) -> None:
        """New results: redraw if the last redraw is old enough."""
        self.round = round_no
        now = self.clock()
        if now < self._due:
            return
        self._due = now + self.interval
        if self.tty:
            self._show(self._view(records))
        else:  # a pipe keeps every print: the status line now, the table at the end
            self._say(self._status_line(records, final=False))

    def result(self, rec: TrialRecord, result: dict[str, Any]) -> None:
        """``verbose=3``: every result, one line (Ray's "Trial ... reported ...")."""
        if self.verbose < 3:
            return
        keys = [k for k in (self.metric, "training_iteration") if k and k in result]
        shown = ", ".join(f"{k}={human(result[k])}" for k in keys)
        self._say(f"Trial {rec.trial} reported {shown} with parameters={rec.trial.config}.")

    def close(self, records: Sequence[TrialRecord], grid: ResultGrid | None, message: str) -> None:
        """The run ended (``grid``: its results; None when it failed): the last table,
        then how it ended and the best result."""
        view = self._view(records, final=True)
        footer = self._footer(grid, message)
        self.live.close()
        if self._live is not None:
            self._live.update(view, refresh=True)
            self._stop_live()
        else:
            self.console.print(view)
        self.console.print(footer)

    def abandon(self) -> None:
        """The run is ending by an error: give the terminal back as it is."""
        self.live.close()
        self._stop_live()

    def _result(self, rec: TrialRecord) -> dict[str, Any]:
        """What a row shows of ``rec``: its last committed result, or, while its segment
        trains, the newer one the segment sent."""
        last = rec.trial.last_result
        if rec.trial.status != TrialStatus.RUNNING:
            return last
        live = self.live.latest(rec.trial_id)
        if live and live.get("training_iteration", 0) > last.get("training_iteration", 0):
            return {**last, **live}
        return last

    # -- drawing ---------------------------------------------------------------
    def _show(self, view: Any) -> None:
        if self._live is not None:
            self._live.update(view, refresh=True)
        else:
            self.console.print(view)

    def _say(self, line: str) -> None:
        from rich.text import Text

        self.console.print(Text(line))  # printed above the live region on a terminal

    def _header(self) -> Any:
        from rich.text import Text

        parts = [f"popflow: {self.name} at {self.path}", f"seed {self.seed}", self.scheduler]
        if self.dashboard:
            parts.append(f"Dask dashboard {self.dashboard}")
        return Text(" · ".join(parts), style="bold")

    def _status_line(self, records: Sequence[TrialRecord], final: bool) -> str:
        counts: dict[str, int] = {}
        for rec in records:
            counts[rec.trial.status.value] = counts.get(rec.trial.status.value, 0) + 1
        states = " | ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        line = f"Trial status: {states} · round {self.round} · {_elapsed(self.clock() - self._t0)}"
        best = self._best(records)
        if best is not None and self.metric:
            value = self._result(best).get(self.metric)
            iteration = self._result(best).get("training_iteration")
            said = f" {self.metric}={human(value)} (iter {iteration})"
            if len(f"{line} · best {best.trial}{said} · done") > self.console.width:
                line += f" · best {best.trial_id}{said}"  # the short id, as in a narrow table
            else:
                line += f" · best {best.trial}{said}"
        return line + (" · done" if final else "")

    def _best(self, records: Sequence[TrialRecord]) -> TrialRecord | None:
        if not self.metric:
            return None
        scored = [
            (float(v), rec)
            for rec in records
            if isinstance(v := self._result(rec).get(self.metric), int | float)
            and not isinstance(v, bool)
            and math.isfinite(v)
        ]
        if not scored:
            return None
        pick = max if self.mode != "min" else min
        return pick(scored, key=lambda sv: sv[0])[1]

    def _view(self, records: Sequence[TrialRecord], final: bool = False) -> Any:
        from rich.console import Group
        from rich.text import Text

        parts = [Text(self._status_line(records, final))]
        if self.tty:  # the live region keeps the header in sight; plain prints have it once
            parts.insert(0, self._header())
        if self.verbose >= 2:
            parts.append(self._table(records))
        return Group(*parts)

    def _table(self, records: Sequence[TrialRecord]) -> Any:
        """The trial table, fitted to the console's width: trials by their short ids
        (``e67f7_00001``) when their names do not fit, then hyperparameter columns left
        out, the last first (the caption names them); the iteration, time and metric
        always show."""
        params = _varying_keys([rec.trial.config for rec in records])
        best = self._best(records)
        shown, hidden = _rows(records, best)
        short, dropped = False, []
        table = self._draw(shown, best, params, short)
        while _natural_width(self.console, table) > self.console.width:
            if not short:
                short = True
            elif params:
                dropped.insert(0, params.pop())
            else:
                break
            table = self._draw(shown, best, params, short)
        notes = []
        if hidden:
            counts: dict[str, int] = {}
            for rec in hidden:
                counts[rec.trial.status.value] = counts.get(rec.trial.status.value, 0) + 1
            more = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
            notes.append(f"... {len(hidden)} more trials not shown ({more})")
        if dropped:
            notes.append(f"not shown at {self.console.width} columns: {', '.join(dropped)}")
        if notes:
            table.caption = "\n".join(notes)
        return table

    def _draw(
        self,
        shown: Sequence[TrialRecord],
        best: TrialRecord | None,
        params: Sequence[str],
        short: bool,
    ) -> Any:
        from rich import box
        from rich.table import Table

        table = Table(box=box.SIMPLE_HEAD if self.tty else box.ASCII)
        table.add_column("Trial id" if short else "Trial name", no_wrap=True)
        table.add_column("status", no_wrap=True)
        for key in params:
            table.add_column(key, justify="right", no_wrap=True)
        table.add_column("iter", justify="right", no_wrap=True)
        table.add_column("time (s)" if short else "total time (s)", justify="right")
        if self.metric:
            table.add_column(self.metric, justify="right", no_wrap=True)
        for rec in shown:
            flat = flatten(rec.trial.config)
            last = self._result(rec)
            row = [
                ("* " if rec is best else "  ") + (rec.trial_id if short else str(rec.trial)),
                rec.trial.status.value,
                *(human(flat.get(k)) for k in params),
                human(last.get("training_iteration")),
                human(round(last["time_total_s"], 2)) if "time_total_s" in last else "",
            ]
            if self.metric:
                row.append(human(last.get(self.metric)))
            table.add_row(*row, style="bold green" if rec is best else None)
        return table

    def _footer(self, grid: ResultGrid | None, message: str) -> Any:
        from rich.text import Text

        lines = [message]
        if grid is not None and self.metric:
            try:
                best = grid.get_best_result()
            except (RuntimeError, ValueError):  # no trial reported the metric
                best = None
            if best is not None:
                lines.append(
                    f"Best trial {best.trial_id}: {self.metric}="
                    f"{human(best.metrics.get(self.metric))} at iteration "
                    f"{best.metrics.get('training_iteration')}, config "
                    + ", ".join(f"{k}={human(v)}" for k, v in flatten(best.config).items())
                )
                if best.checkpoint is not None:
                    lines.append(f"Its checkpoint: {best.checkpoint.path}")
        return Text("\n".join(lines))

    # -- log lines above the live region ---------------------------------------
    def _logs_above(self, originals: set[int]) -> None:
        """Point the console's log handlers at the live region's proxies (rich only
        redirects ``sys.stdout``/``sys.stderr``; a handler keeps the stream it was made
        with), so a log line prints above the table instead of through it."""
        proxy = sys.stderr  # rich's, while the live region is open
        for handler in _console_handlers():
            console = getattr(handler, "console", None)  # Prefect's console handler
            if console is not None and id(console.file) in originals:
                self._restore.append((console, "file", console.file))
                console.file = proxy
            elif isinstance(handler, logging.StreamHandler) and id(handler.stream) in originals:
                self._restore.append((handler, "stream", handler.stream))
                handler.setStream(proxy)

    def _stop_live(self) -> None:
        if self._live is None:
            return
        for owner, attr, value in reversed(self._restore):
            if attr == "stream":
                owner.setStream(value)
            else:
                setattr(owner, attr, value)
        self._restore.clear()
        self._live.stop()
        self._live = None


def _natural_width(console: Any, renderable: Any) -> int:
    """The columns ``renderable`` takes with no width limit (rich's own measure stops at
    the console's width and squeezes the columns instead)."""
    from rich.measure import Measurement

    unlimited = console.options.update(max_width=10_000)
    return Measurement.get(console, unlimited, renderable).maximum


def _console_handlers() -> Iterator[logging.Handler]:
    seen: set[int] = set()
    for name in (None, "prefect", "popflow"):
        for handler in logging.getLogger(name).handlers:
            if id(handler) not in seen:
                seen.add(id(handler))
                yield handler


def _varying_keys(configs: Sequence[dict[str, Any]]) -> list[str]:
    """The (flattened) config keys whose values differ between trials: what a table of a
    population has to show; at most ``MAX_PARAM_COLUMNS``."""
    values: dict[str, set[str]] = {}
    for config in configs:
        for key, value in flatten(config).items():
            values.setdefault(key, set()).add(repr(value))
    keys = [k for k, seen in values.items() if len(seen) > 1]
    return keys[:MAX_PARAM_COLUMNS]


def _rows(
    records: Sequence[TrialRecord], best: TrialRecord | None
) -> tuple[list[TrialRecord], list[TrialRecord]]:
    """The rows shown (in trial order) and those left out: all when they fit, else the
    best trial, the live ones, then the rest, up to ``MAX_ROWS``."""
    if len(records) <= MAX_ROWS:
        return list(records), []
    rank = {status: i for i, status in enumerate(_ORDER)}
    order = sorted(
        records,
        key=lambda r: (r is not best, rank.get(r.trial.status, len(_ORDER)), r.index),
    )
    shown = sorted(order[:MAX_ROWS], key=lambda r: r.index)
    return shown, order[MAX_ROWS:]


@contextmanager
def shown(table: LiveTable | None, client: Any) -> Iterator[LiveTable | None]:
    """Within: ``table`` started on ``client``'s cluster; a run that ends by an error gives
    the terminal back."""
    if table is None:
        yield None
        return
    table.start(getattr(client, "dashboard_link", None), client)
    try:
        yield table
    except BaseException:
        table.abandon()
        raise
