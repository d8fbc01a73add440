"""Credentials in storage options: the one place that knows which values are secret.

Secrets never appear in reprs, log records, error messages or serialised
forms: :func:`redact` masks them in text, and :class:`StorageOptions` holds an
options dict with its secrets in a :class:`Secrets`, which refuses to be pickled
or printed. A pickled :class:`StorageOptions` (inside a ``Storage``, a
``RunConfig``, a ``Tuner``) carries the options less their secrets, and a random
token naming the secrets in this process (:func:`known_secrets`): unpickled here,
the secrets come back; elsewhere they come from the environment (the AWS chain), or
from the driver, which hands them to its Dask workers through a worker plugin of
its own (:mod:`popflow.infra.cluster.credentials_plugin`), never inside a pickle.
"""

from __future__ import annotations

import json
import threading
import uuid
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


def only_secrets(options: Mapping[str, Any]) -> dict[str, Any]:
    """What :func:`without_secrets` leaves out of ``options``, nested as there."""
    out: dict[str, Any] = {}
    for k, v in options.items():
        if is_secret_key(k):
            out[k] = v
        elif isinstance(v, Mapping) and (inner := only_secrets(v)):
            out[k] = inner
    return out


def _merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` on top, nested mappings merged; every mapping a new dict (so
    a caller that changes what it got changes nothing kept)."""
    out = {k: _merged({}, v) if isinstance(v, Mapping) else v for k, v in base.items()}
    for k, v in over.items():
        if isinstance(v, Mapping):
            out[k] = _merged(out[k] if isinstance(out.get(k), Mapping) else {}, v)
        else:
            out[k] = v
    return out


class Secrets:
    """Secret values: never printed, never pickled (a pickle would write them to disk,
    Prefect's database or the wire)."""

    __slots__ = ("_values",)

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values

    def reveal(self) -> dict[str, Any]:
        return self._values

    def __repr__(self) -> str:
        return "Secrets(<redacted>)"

    __str__ = __repr__

    def __reduce_ex__(self, protocol: object) -> Any:
        raise TypeError(
            "popflow never pickles credentials: a Secrets object cannot be pickled (hand "
            "credentials over as storage_options where they are used, or through the "
            "environment: the AWS chain)"
        )

    def __copy__(self) -> Secrets:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Secrets:
        return self


# This process's secrets by token, and the token of each set (as canonical JSON), so one
# set of credentials has one token here, whatever object holds it.
_LOCK = threading.Lock()
_BY_TOKEN: dict[str, Secrets] = {}
_TOKENS: dict[str, str] = {}
_USERS: dict[str, int] = {}  # token -> worker plugins that gave it (see forget)


def _canonical(values: Mapping[str, Any]) -> str:
    return json.dumps(values, sort_keys=True, default=repr)


def _token_for(values: dict[str, Any]) -> str:
    key = _canonical(values)
    with _LOCK:
        token = _TOKENS.get(key)
        if token is None:
            token = _TOKENS[key] = uuid.uuid4().hex  # names the secrets; says nothing of them
            _BY_TOKEN[token] = Secrets(values)
        return token


def known_secrets(token: str) -> Secrets | None:
    """The secrets ``token`` names in this process, if it knows them."""
    with _LOCK:
        return _BY_TOKEN.get(token)


def remember(token: str, values: dict[str, Any]) -> None:
    """Learn the secrets ``token`` names (a Dask worker, from its driver's plugin)."""
    with _LOCK:
        _BY_TOKEN[token] = Secrets(values)
        _TOKENS.setdefault(_canonical(values), token)
        _USERS[token] = _USERS.get(token, 0) + 1


def forget(token: str) -> None:
    """Undo one :func:`remember`: the secrets go once every plugin that gave them has."""
    with _LOCK:
        left = _USERS.get(token, 0) - 1
        if left > 0:
            _USERS[token] = left
            return
        _USERS.pop(token, None)
        secrets = _BY_TOKEN.pop(token, None)
        if secrets is not None:
            _TOKENS.pop(_canonical(secrets.reveal()), None)


class StorageOptions:
    """fsspec storage options, their credentials held apart in a :class:`Secrets`.

    Its repr masks every credential; pickled, it carries the options less their
    credentials, and a token that gives them back in a process that knows it (this
    one; a Dask worker its driver told, :func:`remember`). ``value`` is the whole dict
    for fsspec (credentials included: never log or persist it).

    >>> opts = StorageOptions({"key": "AKIA1234", "endpoint_url": "http://s3"})
    >>> opts
    StorageOptions({'endpoint_url': 'http://s3', 'key': '***'})
    >>> import pickle
    >>> b"AKIA1234" in pickle.dumps(opts)
    False
    >>> pickle.loads(pickle.dumps(opts)).value["key"]
    'AKIA1234'
    """

    __slots__ = ("_public", "_secrets", "_token")

    def __init__(self, options: Mapping[str, Any] | StorageOptions | None = None) -> None:
        if isinstance(options, StorageOptions):
            self._public, self._secrets, self._token = (
                options._public,
                options._secrets,
                options._token,
            )
            return
        if options is not None and not isinstance(options, Mapping):
            raise TypeError(
                f"`storage_options` must be a dict of fsspec options, got {type(options).__name__}"
            )
        options = dict(options or {})
        self._public = without_secrets(options)
        secret = only_secrets(options)
        self._token = _token_for(secret) if secret else None
        self._secrets = known_secrets(self._token) if self._token else None

    @property
    def value(self) -> dict[str, Any]:
        """The options, credentials included (for fsspec; never log or persist them)."""
        if self._secrets is None:
            return _merged({}, self._public)
        return _merged(self._public, self._secrets.reveal())

    @property
    def public(self) -> dict[str, Any]:
        """The options less their credentials."""
        return _merged({}, self._public)

    @property
    def token(self) -> str | None:
        """The name of its credentials in this process (None: it has none here)."""
        return self._token if self._secrets is not None else None

    def secrets(self) -> dict[str, Any]:
        """Its credentials alone (what a driver hands its workers; never persist it)."""
        return self._secrets.reveal() if self._secrets is not None else {}

    def __repr__(self) -> str:
        shown = _merged(
            self._public, _masked(self._secrets.reveal()) if self._secrets is not None else {}
        )
        return f"StorageOptions({dict(sorted(shown.items()))!r})"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StorageOptions):
            return self.value == other.value
        if isinstance(other, Mapping):
            return self.value == dict(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        return bool(self._public) or self._secrets is not None

    def __reduce__(self) -> tuple[Any, ...]:
        # never the secrets: their token, which only a process that knows them can read
        return (_unpickled, (self._public, self._token))

    def __copy__(self) -> StorageOptions:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> StorageOptions:
        return self


def _masked(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _masked(v) if isinstance(v, Mapping) else "***" for k, v in values.items()}


def _unpickled(public: dict[str, Any], token: str | None) -> StorageOptions:
    """A pickled :class:`StorageOptions` read back: its credentials if this process knows
    ``token``, else the options without them."""
    opts = StorageOptions.__new__(StorageOptions)
    opts._public, opts._token = public, token
    opts._secrets = known_secrets(token) if token is not None else None
    return opts


#: The name a Storage (:mod:`popflow.infra.storage.folder`) still uses for it.
Hidden = StorageOptions
