"""What the ``popflow`` commands share: finding and reading the experiment a command names,
and a user's mistake as one line (:class:`UserError`).

Each function imports what it uses when it runs (fsspec, the experiment reader):
``popflow --help`` imports none of it.
"""

from __future__ import annotations

import argparse
import posixpath
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from popflow.flows.experiment.reading import CommittedExperiment
    from popflow.infra.storage.folder import Storage, StorageError

#: what a storage error says when the store wants credentials it was not given
_CREDENTIAL_SIGNS = (
    "NoCredentialsError",
    "Unable to locate credentials",
    "PermissionError",
    "AccessDenied",
    "Access Denied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "Forbidden",
)
_CREDENTIALS_HINT = (
    "give credentials: --credentials-block NAME, --storage-options "
    '\'{"key": "...", "secret": "..."}\' or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY'
)


class UserError(Exception):
    """A mistake the user can mend: one line on stderr, with ``hint``, and exit status 2."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        message = str(self.args[0])
        return f"{message} ({self.hint})" if self.hint else message


def user_error(message: str) -> NoReturn:
    """One line on stderr and exit status 2 (argparse's for a usage error)."""
    print(f"popflow: {message}", file=sys.stderr)
    raise SystemExit(2)


# -- opening and reading an experiment ------------------------------------------------


def split_path(given: str) -> tuple[str, str]:
    path = given.rstrip("/")
    parent, name = posixpath.split(path)
    if not name or name.endswith(":"):  # "/" or "s3://" names no folder
        raise UserError(f"{given!r} does not name an experiment folder", "give <storage>/<name>")
    return parent or ".", name


def storage_options_of(args: argparse.Namespace) -> dict[str, Any] | None:
    """The storage options of ``args``' flags (a credentials block is loaded here)."""
    from popflow.infra.storage.options_cli import resolve_storage_options

    try:
        return resolve_storage_options(args.path, args.storage_options, args.credentials_block)
    except (ValueError, ImportError) as e:  # no such block, an S3 block for a local path
        raise UserError(str(e)) from e


def open_storage(url: str, options: dict[str, Any] | None) -> Storage:
    from popflow.infra.storage.folder import Storage

    try:
        return Storage(url, options)
    except (ValueError, ImportError) as e:  # "Protocol not known", "Install gcsfs to ..."
        raise UserError(
            f"cannot open {url!r}: {e}",
            "give a local folder or an fsspec URL such as s3://bucket/prefix",
        ) from e


def storage_error(e: StorageError) -> UserError:
    text = str(e)
    if any(sign in text for sign in _CREDENTIAL_SIGNS):
        return UserError(text, _CREDENTIALS_HINT)
    return UserError(text, "check the URL, and --storage-options (endpoint_url) for its store")


def experiments_in(storage: Storage, limit: int = 20) -> list[str]:
    """The experiments directly under ``storage`` (a storage root given for an experiment)."""
    from popflow.infra.store.layout import EXPERIMENT_FILE

    try:
        names = storage.listdir()[:limit]
        return [n for n in names if storage.file_exists(n, EXPERIMENT_FILE)]
    except OSError:
        return []


@contextmanager
def reading(storage: Storage) -> Iterator[None]:
    """Errors reading the experiment at ``storage`` as one :class:`UserError` each."""
    from popflow.flows.experiment.reading import MalformedExperiment, NoExperiment
    from popflow.infra.storage.folder import StorageError, UnsafePath
    from popflow.infra.store.commit_log import DamagedLog

    try:
        yield
    except NoExperiment as e:
        found = experiments_in(storage)
        hint = f"it holds the experiments {', '.join(found)}: give {storage.url}/<name>"
        raise UserError(str(e), hint if found else "") from e
    except StorageError as e:
        raise storage_error(e) from e
    except (DamagedLog, MalformedExperiment, UnsafePath) as e:
        raise UserError(str(e)) from e


def storage_of(args: argparse.Namespace) -> Storage:
    """The experiment folder ``args`` name, its options resolved (nothing read yet)."""
    split_path(args.path)
    return open_storage(args.path, storage_options_of(args))


def read_experiment(args: argparse.Namespace) -> CommittedExperiment:
    """The experiment at ``args.path`` as of its latest commit (reads only)."""
    from popflow.flows.experiment.reading import read_committed

    storage = storage_of(args)
    with reading(storage):
        return read_committed(storage.url, storage.storage_options)


def resume_command(args: argparse.Namespace, url: str) -> str:
    """The command that resumes ``url`` (storage options are never echoed: secrets)."""
    command = f"popflow resume {url}"
    if args.credentials_block:
        command += f" --credentials-block {args.credentials_block}"
    if args.storage_options is not None:
        command += " --storage-options '...'"
    return command
