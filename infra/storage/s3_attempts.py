"""The fsspec filesystems popflow's storage uses: on S3, one attempt per call at s3fs's and
botocore's level, under popflow's own retries.

Each of those layers retries timeouts silently (s3fs 5 times, botocore's connect timeouts
5 times more): a call to an unreachable store took minutes before popflow's retry, which
logs each attempt and knows the lease's deadline
(:mod:`popflow.infra.storage.calls`), saw it. The user's storage_options take precedence.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import fsspec

#: botocore's retries for popflow's S3 filesystems (its ``config_kwargs``)
S3_ONE_ATTEMPT = {"retries": {"max_attempts": 1}}


def url_to_fs(url: str, options: Mapping[str, Any]) -> tuple[fsspec.AbstractFileSystem, str]:
    """``fsspec.core.url_to_fs`` with one attempt per call on S3; the filesystem and path."""
    protocol = fsspec.core.split_protocol(url)[0] or "file"
    fs, root = fsspec.core.url_to_fs(url, **_fs_options(protocol, options))
    _one_attempt(fs, options)
    return fs, root


def filesystem(protocol: str, options: Mapping[str, Any]) -> fsspec.AbstractFileSystem:
    """``fsspec.filesystem`` with one attempt per call on S3."""
    fs = fsspec.filesystem(protocol, **_fs_options(protocol, options))
    _one_attempt(fs, options)
    return fs


def _fs_options(protocol: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with botocore's :data:`S3_ONE_ATTEMPT` under them on S3."""
    if protocol not in ("s3", "s3a"):
        return dict(options)
    return {**options, "config_kwargs": {**S3_ONE_ATTEMPT, **(options.get("config_kwargs") or {})}}


def _one_attempt(fs: fsspec.AbstractFileSystem, options: Mapping[str, Any]) -> None:
    """s3fs's own retries (a class attribute, not an option) off on ``fs``: an instance
    of popflow's alone, fsspec caching instances by their options, botocore's among them."""
    if "retries" in vars(type(fs)) and "retries" not in (options.get("config_kwargs") or {}):
        fs.retries = 1
