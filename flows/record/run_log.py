"""The log of the Prefect run a line belongs to: what the console and the Prefect UI show.

popflow's own loggers (``popflow.*``) stay quiet unless the user configures logging;
what a person follows a run by (the run's start, each round's summary and
decisions, a trial's error, the run's end) goes once to the run's logger, which
Prefect prints and sends to its API, so the UI holds it in the run's logs. A training's
line prints when said (:mod:`popflow.flows.console.live_lines`), in time order with
popflow's module loggers; its record, which can be seconds behind, sends it to the API.
"""

from __future__ import annotations

import logging
from typing import Any

#: popflow's own logger, by its fixed name rather than this module's: the lines it takes
#: are the run's (start, rounds, errors, end) when no Prefect run takes them, and it is
#: the parent of every ``popflow.*`` module logger, so a user configures one name
popflow_logger = logging.getLogger("popflow")


def run_logger() -> Any:
    """The logger of the run this line belongs to: in a training thread its feed's (the
    run's Prefect record logs it, :mod:`popflow.flows.record.run_feed`); in a Prefect run its
    logger; else popflow's."""
    from popflow.flows.record.run_feed import CURRENT, FeedLogger

    feed = CURRENT.get()
    if feed is not None:
        return FeedLogger(feed)
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return popflow_logger
