"""Credentials in storage options: the one place that knows which values are secret.

Secrets never appear in reprs, log records, error messages or serialised
forms: :func:`redact` masks them in text, and :class:`Hidden` keeps an
options dict out of reach of serialisers that walk ``vars()`` (FastAPI's
``jsonable_encoder``, which Prefect uses for flow parameters) while it still
pickles, so Dask workers receive it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_SECRET_HINTS = ("key", "secret", "token", "password", "passwd", "credential")


def secret_values(options: Mapping[str, Any]) -> list[str]:
    """String values in ``options`` (nested too) whose key names a credential, longest first."""
    found: list[str] = []
    for k, v in options.items():
        if isinstance(v, Mapping):
            found += secret_values(v)
        elif isinstance(v, str) and len(v) >= 4 and is_secret_key(k):
            found.append(v)
    return sorted(set(found), key=len, reverse=True)


def is_secret_key(key: object) -> bool:
    return any(h in str(key).lower() for h in _SECRET_HINTS)


def without_secrets(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` (nested too) without the entries whose key names a credential."""
    return {
        k: without_secrets(v) if isinstance(v, Mapping) else v
        for k, v in options.items()
        if not is_secret_key(k)
    }


def redact(text: str, secrets: list[str]) -> str:
    for s in secrets:
        text = text.replace(s, "***")
    return text


class Hidden:
    """Holds a value out of reach of ``vars()``-walking serialisers; pickles normally."""

    __slots__ = ("value",)

    def __init__(self, value: dict[str, Any]) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<hidden>"
