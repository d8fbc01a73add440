"""What the record asks of Prefect's run context without importing Prefect for it."""

from __future__ import annotations

import sys
from typing import Any

#: The state types a cancel leaves a flow run in.
CANCEL_TYPES = frozenset({"CANCELLING", "CANCELLED"})


def flow_run_context() -> Any:
    """The Prefect flow run this thread runs in (a deployment's, or a user's ``@flow``), if
    any. A script that has not imported Prefect runs in none: the answer costs no import
    (Prefect's is a heavy one)."""
    if "prefect.context" not in sys.modules:
        return None
    from prefect.context import FlowRunContext

    return FlowRunContext.get()
