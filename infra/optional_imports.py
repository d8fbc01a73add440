"""The optional extras: a module imported when first needed, or a one-line hint saying
which extra installs it."""

from __future__ import annotations

import importlib
from typing import Any


def require(module: str, extra: str, who: str) -> Any:
    """Import ``module`` of the optional ``extra``; missing, a one-line hint to install it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise  # installed, but something it imports is missing: say that
        raise ImportError(f"{who} needs {module}: pip install 'popflow[{extra}]'") from None
