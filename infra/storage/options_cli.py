"""Storage options from a command line or a flow's parameters: explicit JSON, a Prefect block.

Every example's command line takes the same two flags::

    --storage-options '{"client_kwargs": {"endpoint_url": "http://127.0.0.1:5000"}}'
    --credentials-block s3-bucket/my-bucket        # or aws-credentials/NAME, or NAME

>>> import argparse
>>> parser = argparse.ArgumentParser()
>>> add_storage_arguments(parser)
>>> args = parser.parse_args(["--storage-options", '{"anon": true}'])
>>> storage_options_from_args(args)
{'anon': True}

The block's options come first and the explicit ones go over them (nested
dicts such as ``client_kwargs`` merge key by key), so a block's credentials
and a command line's endpoint go together. With neither, the options are
None: s3fs's default (environment variables, the AWS chain). Loading a block
imports Prefect; this module does not (Dask workers import the examples).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from popflow.infra.storage.aws_blocks import block_name, storage_options_from_block

__all__ = [
    "add_storage_arguments",
    "credentials_block_name",
    "json_object",
    "merge_options",
    "resolve_storage_options",
    "storage_options_from_args",
]

_S3_SCHEMES = ("s3://", "s3a://")
_EXAMPLE = '{"client_kwargs": {"endpoint_url": "http://127.0.0.1:5000"}}'


def json_object(text: str) -> dict[str, Any]:
    """An argparse ``type``: a JSON object, or an error saying what it got."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(
            f"not JSON ({e.msg} at character {e.pos}): give an object such as '{_EXAMPLE}'"
        ) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"is JSON {type(value).__name__} {value!r}, but must be an object of fsspec options"
        )
    return value


def credentials_block_name(text: str) -> str:
    """An argparse ``type``: a block name as :func:`~popflow.infra.storage.aws_blocks.block_name`
    reads it (checked here; the block is loaded when the run starts)."""
    try:
        block_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def add_storage_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--storage-options JSON`` and ``--credentials-block NAME`` to ``parser``."""
    parser.add_argument(
        "--storage-options",
        type=json_object,
        default=None,
        metavar="JSON",
        help=f"fsspec options as a JSON object, e.g. '{_EXAMPLE}' (over the block's)",
    )
    parser.add_argument(
        "--credentials-block",
        type=credentials_block_name,
        default=None,
        metavar="NAME",
        help="S3 credentials from a Prefect block: aws-credentials/NAME (or NAME), "
        "minio-credentials/NAME or s3-bucket/NAME (needs popflow[aws]; --storage s3://...)",
    )


def merge_options(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` on top; nested dicts merge key by key (inputs unchanged).

    >>> merge_options({"key": "k", "client_kwargs": {"region_name": "eu-west-1"}},
    ...               {"client_kwargs": {"endpoint_url": "http://x"}})
    {'key': 'k', 'client_kwargs': {'region_name': 'eu-west-1', 'endpoint_url': 'http://x'}}
    """
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = merge_options(out[k], v)
        else:
            out[k] = v
    return out


def resolve_storage_options(
    storage: str | None,
    storage_options: Mapping[str, Any] | None = None,
    credentials_block: str | None = None,
) -> dict[str, Any] | None:
    """The options for ``storage``: ``credentials_block``'s with ``storage_options`` over
    them; None when neither is given. A block needs an S3 ``storage`` URL."""
    if not credentials_block:
        return dict(storage_options) if storage_options is not None else None
    if storage is not None and not str(storage).startswith(_S3_SCHEMES):
        raise ValueError(
            f"`credentials_block` {credentials_block!r} holds S3 credentials, but `storage` is "
            f"{str(storage)!r}: give an S3 URL such as s3://bucket/prefix"
        )
    return merge_options(storage_options_from_block(credentials_block), storage_options or {})


def storage_options_from_args(args: argparse.Namespace) -> dict[str, Any] | None:
    """The options that :func:`add_storage_arguments`' flags give for ``args.storage``."""
    return resolve_storage_options(
        getattr(args, "storage", None), args.storage_options, args.credentials_block
    )
