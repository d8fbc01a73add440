"""What the console shows while a run goes, by Ray's ``verbose`` (0-3).

- 0: warnings only, no table;
- 1: the status line (Ray's "Trial status: ..."), the run's start and end, errors;
- 2 (the default): the same with the trial table (:mod:`popflow.flows.console.live_table`);
- 3: the table, a line per result, and the detail: each round's summary and each
  scheduler decision in Ray's words, and popflow's debug lines.

The detail always reaches the Prefect API, so the UI's logs hold every decision;
only the console leaves it out below 3, so a normal run's output fits on a screen.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from popflow.flows.spec.config import VERBOSE_LEVELS, check_verbose

#: ``extra`` of a log record that is detail: the console shows it at ``verbose=3`` only
DETAIL = {"popflow_detail": True}


#: Prefect's HTTP client logs each API request at INFO (``HTTP Request: POST ...``)
HTTP_LOGGERS = ("httpx", "httpcore")


def quiet_http_requests() -> None:
    """Keep Prefect's per-request lines off the console at any ``verbose``: dozens of
    them per run in a script with ``logging.basicConfig(level=logging.INFO)``. A level
    the user set on those loggers is kept."""
    for name in HTTP_LOGGERS:
        http = logging.getLogger(name)
        if http.level == logging.NOTSET:
            http.setLevel(logging.WARNING)


def _is_not_detail(record: logging.LogRecord) -> bool:
    if getattr(record, "popflow_detail", False):
        return False
    # Prefect's line for each round task that completed: one per round, nothing to read;
    # and for the flow run that completed: the table's footer says how it ended
    if not record.getMessage().startswith("Finished in state Completed"):
        return True
    task_run = getattr(record, "task_run_name", None)
    if task_run is None:  # a flow run's: the tune run's (the only one while it runs)
        return not hasattr(record, "flow_run_name")
    return not str(task_run).startswith("round-")


@contextmanager
def console_verbosity(verbose: int | None) -> Iterator[None]:
    """While a run goes: the console's handlers (Prefect's, or the user's own on the root
    logger) leave out the detail below ``verbose=3``; a ``verbose`` given sets Prefect's
    console handler to its level, and 3 popflow's logger to DEBUG. None keeps the user's
    logging as it is, detail left out."""
    from prefect.logging.configuration import setup_logging
    from prefect.logging.handlers import PrefectConsoleHandler

    quiet_http_requests()
    root = logging.getLogger()
    if verbose is not None and not any(isinstance(h, PrefectConsoleHandler) for h in root.handlers):
        setup_logging()  # Prefect sets up its logging once, on its first run
    level = check_verbose(verbose)
    consoles = [h for h in root.handlers if isinstance(h, PrefectConsoleHandler)]
    filtered = [h for h in root.handlers if level < 3]
    popflow_logger = logging.getLogger("popflow")
    saved = [h.level for h in consoles], popflow_logger.level
    if verbose is not None:
        for h in consoles:
            h.setLevel(VERBOSE_LEVELS[verbose])
        if verbose == 3:
            popflow_logger.setLevel(logging.DEBUG)
    for h in filtered:
        h.addFilter(_is_not_detail)
    try:
        yield
    finally:
        for h in filtered:
            h.removeFilter(_is_not_detail)
        if verbose is not None:
            for h, old in zip(consoles, saved[0], strict=True):
                h.setLevel(old)
            popflow_logger.setLevel(saved[1])
