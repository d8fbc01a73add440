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
import re
import threading
import uuid
from collections.abc import Mapping
from typing import Any, NamedTuple
from urllib.parse import unquote_plus, urlsplit, urlunsplit

# A key is secret when its name holds one of these (lower-cased): fsspec's and the
# clouds' option names (key, secret, token, sas_token, account_key, credential,
# connection_string, session: a botocore/aiobotocore session holds keys) and HTTP
# headers (Authorization, Proxy-Authorization, Cookie, X-Api-Key, X-Auth-Token).
_SECRET_HINTS = (
    "key",
    "secret",
    "token",
    "password",
    "passwd",
    "pwd",
    "credential",
    "connection_str",
    "connectionstring",
    "auth",
    "cookie",
    "session",
)
# Credential objects (botocore/aiobotocore sessions and credentials, google-auth's,
# azure-identity's) are secret under any key: they hold keys however they print.
_SECRET_MODULES = ("botocore", "aiobotocore", "boto3", "google.auth", "google.oauth2", "azure")
# "Bearer <token>", "Basic <b64>": an Authorization header's value, under any key
_AUTH_VALUE = re.compile(r"^\s*(bearer|basic|digest|token|aws4-hmac-sha256|sharedkey)\s+\S", re.I)
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://", re.I)


class _Nothing:
    """No value on this side of a split (a dict entry that is all secret, or all public)."""


_NOTHING = _Nothing()


def is_secret_key(key: object) -> bool:
    return any(h in str(key).lower() for h in _SECRET_HINTS)


def _is_secret_param(name: str) -> bool:
    """A connection string's or a URL query's parameter that is a credential (AccountKey=,
    SharedAccessSignature=, Password=; sig= and X-Amz-Signature= of a signed URL)."""
    name = name.strip().lower()
    return is_secret_key(name) or name == "sig" or "signature" in name


class _UrlSplit(NamedTuple):
    public: str  # the URL less its credentials
    secrets: list[str]  # the credentials, as written and percent-decoded
    masked: str  # the URL with ``***`` for each credential


def _url_parts(value: str) -> _UrlSplit | None:
    """How a URL that holds credentials (userinfo, secret query parameters) splits; None
    for any other string."""
    if not _URL.match(value):
        return None
    try:
        parts = urlsplit(value)
    except ValueError:
        return None
    found: list[str] = []
    netloc, masked_netloc = parts.netloc, parts.netloc
    if "@" in netloc:
        userinfo, netloc = netloc.rsplit("@", 1)
        found += [userinfo, *userinfo.split(":", 1)]
        masked_netloc = f"***@{netloc}"
    kept, masked = [], []
    for pair in parts.query.split("&") if parts.query else []:
        name, eq, v = pair.partition("=")
        if _is_secret_param(unquote_plus(name)):
            found.append(v)
            masked.append(f"{name}{eq}***")
        else:
            kept.append(pair)
            masked.append(pair)
    if not found:
        return None
    found += [unquote_plus(f) for f in found]
    return _UrlSplit(
        urlunsplit(parts._replace(netloc=netloc, query="&".join(kept))),
        [f for f in dict.fromkeys(found) if f],
        urlunsplit(parts._replace(netloc=masked_netloc, query="&".join(masked))),
    )


def _connection_secrets(value: str) -> list[str]:
    """The credentials in a connection string (``Name=value;...``: Azure's AccountKey=,
    SharedAccessSignature=; a database's Password=)."""
    found = []
    for part in value.split(";"):
        name, eq, v = part.partition("=")
        if eq and _is_secret_param(name):
            found.append(v.strip())
    return found


def _string_secrets(value: str) -> list[str] | None:
    """The credentials ``value`` holds by its shape (None: it looks like none)."""
    url = _url_parts(value)
    if url is not None:
        return url.secrets
    if m := _AUTH_VALUE.match(value):
        return [value[m.end() - 1 :].strip()]
    found = _connection_secrets(value)
    return found or None


def _is_secret_object(value: object) -> bool:
    module = type(value).__module__ or ""
    return any(module == m or module.startswith(m + ".") for m in _SECRET_MODULES)


def _holds_secret(value: object) -> bool:
    """Whether a value under a key that names nothing secret is one, by its shape."""
    if isinstance(value, str):
        return _string_secrets(value) is not None
    if isinstance(value, Mapping):
        return any(is_secret_key(k) or _holds_secret(v) for k, v in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        # a header list such as [("Authorization", "Bearer ...")] too
        return any(
            _holds_secret(v)
            or (isinstance(v, list | tuple) and len(v) == 2 and is_secret_key(v[0]))
            for v in value
        )
    return _is_secret_object(value)


def _split(value: Any) -> tuple[Any, Any]:
    """``value`` as (what may be shown and pickled, its credentials), either side
    ``_NOTHING`` where it has none: by key name (:data:`_SECRET_HINTS`) and by shape (a
    URL's userinfo and signed query, an Authorization value, a connection string, a
    credential object). A URL keeps its public part: ``http://u:p@host`` splits into
    ``http://host`` and itself."""
    if isinstance(value, Mapping):
        public: dict[Any, Any] = {}
        secret: dict[Any, Any] = {}
        for k, v in value.items():
            if is_secret_key(k):
                secret[k] = v
                continue
            p, s = _split(v)
            if p is not _NOTHING:
                public[k] = p
            if s is not _NOTHING:
                secret[k] = s
        return public, (secret or _NOTHING)
    if isinstance(value, str):
        url = _url_parts(value)
        if url is not None:
            return url.public, value
    if _holds_secret(value):
        return _NOTHING, value
    return value, _NOTHING


def _leaf_secrets(value: Any) -> list[str]:
    """The strings to mask in text for a secret ``value`` (nested too): a URL's userinfo
    and signature rather than the whole URL, so that a message still names the host."""
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _leaf_secrets(v)]
    if isinstance(value, list | tuple | set | frozenset):
        return [s for v in value for s in _leaf_secrets(v)]
    if not isinstance(value, str):
        return []
    url = _url_parts(value)
    if url is not None:
        return url.secrets
    return [value, *(_string_secrets(value) or [])]


def secret_values(options: Mapping[str, Any]) -> list[str]:
    """The credentials' strings in ``options`` (nested too), longest first: what
    :func:`redact` masks in a message."""
    found = [s for s in _leaf_secrets(only_secrets(options)) if len(s) >= 4]
    return sorted(set(found), key=len, reverse=True)


def without_secrets(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` (nested too) without their credentials (see :func:`_split`)."""
    return _split(options)[0]


def password_out_of_url(url: str) -> tuple[str, str | None]:
    """``url`` without the password in its userinfo, and that password (percent-decoded;
    ``None``: it has none): ``sftp://alice:pw@host/x`` is ``sftp://alice@host/x`` and
    ``"pw"``, which fsspec takes as the ``password`` option (ftp, sftp, smb)."""
    if not _URL.match(url):
        return url, None
    try:
        parts = urlsplit(url)
    except ValueError:
        return url, None
    userinfo, at, host = parts.netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    if not at or not colon:
        return url, None
    return urlunsplit(parts._replace(netloc=f"{user}@{host}")), unquote_plus(password)


def redact(text: str, secrets: list[str]) -> str:
    for s in secrets:
        text = text.replace(s, "***")
    return text


def only_secrets(options: Mapping[str, Any]) -> dict[str, Any]:
    """The credentials :func:`without_secrets` leaves out of ``options``, nested as there
    (a URL whole, userinfo and all)."""
    secret = _split(options)[1]
    return {} if secret is _NOTHING else secret


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
    return json.dumps(values, sort_keys=True, default=_identity)


def _identity(value: object) -> str:
    """What tells a value JSON cannot say apart: bytes by content, an object (a session, a
    credentials object) by identity, never by a repr that two of them may share."""
    if isinstance(value, bytes | bytearray):
        return repr(bytes(value))
    return f"<{type(value).__module__}.{type(value).__qualname__} at {id(value):#x}>"


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
    return {
        k: _masked(v) if isinstance(v, Mapping) else _masked_value(v) for k, v in values.items()
    }


def _masked_value(value: Any) -> str:
    """``'***'``; a URL shown with ``***`` for its credentials (``http://***@host``)."""
    if isinstance(value, str) and (url := _url_parts(value)) is not None:
        return url.masked
    return "***"


def _unpickled(public: dict[str, Any], token: str | None) -> StorageOptions:
    """A pickled :class:`StorageOptions` read back: its credentials if this process knows
    ``token``, else the options without them."""
    opts = StorageOptions.__new__(StorageOptions)
    opts._public, opts._token = public, token
    opts._secrets = known_secrets(token) if token is not None else None
    return opts


#: The name a Storage (:mod:`popflow.infra.storage.folder`) still uses for it.
Hidden = StorageOptions
