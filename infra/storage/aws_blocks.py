"""S3 credentials from a Prefect block: prefect-aws's blocks as s3fs storage options.

A deployment names a block (a flow-run parameter that is safe to show); the
flow run loads it from the Prefect server and hands the options to
:class:`~popflow.infra.storage.folder.Storage`, which keeps them out of reprs, logs
and Prefect's parameters. The name is Prefect's ``"<block type slug>/<name>"``:

- ``"aws-credentials/my-creds"`` (or plain ``"my-creds"``): an ``AwsCredentials`` block;
- ``"minio-credentials/my-minio"``: a ``MinIOCredentials`` block;
- ``"s3-bucket/my-bucket"``: an ``S3Bucket`` block; its ``credentials`` give the
  options and :func:`storage_url_from_block` its ``s3://<bucket_name>/<bucket_folder>``.

How a block's fields become s3fs's options (:func:`options_of`)::

    aws_access_key_id                      -> key
    aws_secret_access_key                  -> secret
    aws_session_token                      -> token
    profile_name                           -> profile
    region_name                            -> client_kwargs.region_name
    aws_client_parameters.endpoint_url     -> client_kwargs.endpoint_url
    aws_client_parameters.verify           -> client_kwargs.verify (verify_cert_path wins)
    aws_client_parameters.use_ssl (False)  -> client_kwargs.use_ssl
    aws_client_parameters.api_version      -> client_kwargs.api_version
    aws_client_parameters.config           -> config_kwargs ("unsigned" signing: anon)

Prefect and prefect-aws (``pip install 'popflow[aws]'``) are imported only when
a block is loaded: Dask workers import this module's importers without them.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["block_name", "options_of", "storage_options_from_block", "storage_url_from_block"]

#: The block types a name may give, by Prefect's block type slug.
BLOCK_TYPES = ("aws-credentials", "minio-credentials", "s3-bucket")

_INSTALL = "pip install 'popflow[aws]'"


def block_name(name: str) -> tuple[str, str]:
    """``"s3-bucket/data"`` -> ``("s3-bucket", "data")``; a bare name is an aws-credentials one.

    >>> block_name("s3-bucket/data"), block_name("my-creds")
    (('s3-bucket', 'data'), ('aws-credentials', 'my-creds'))
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(
            f"the credentials block is {name!r}, but must name a Prefect block, "
            "e.g. 'aws-credentials/my-creds' or 's3-bucket/my-bucket'"
        )
    slug, sep, document = name.strip().partition("/")
    if not sep:
        return "aws-credentials", slug
    if slug not in BLOCK_TYPES or not document:
        raise ValueError(
            f"the credentials block is {name!r}, but must be '<type>/<name>' with <type> one "
            f"of {list(BLOCK_TYPES)} (or a bare name, for aws-credentials)"
        )
    return slug, document


def _block_classes() -> dict[str, type]:
    try:
        from prefect_aws import AwsCredentials, MinIOCredentials, S3Bucket
    except ImportError as e:
        raise ImportError(
            f"a credentials block needs prefect-aws ({e}): {_INSTALL}, where the flow runs"
        ) from None
    return {
        "aws-credentials": AwsCredentials,
        "minio-credentials": MinIOCredentials,
        "s3-bucket": S3Bucket,
    }


def _quiet_http_requests() -> None:
    """Keep Prefect's client's request lines (httpx's, at INFO) off the console: a block's
    read shows its URL with ``include_secrets=true``. A level the user set on those
    loggers is kept (as popflow.flows.console.verbose.quiet_http_requests, for a run)."""
    for name in ("httpx", "httpcore"):
        http = logging.getLogger(name)
        if http.level == logging.NOTSET:
            http.setLevel(logging.WARNING)


def load_block(name: str) -> Any:
    """The prefect-aws block ``name`` (see :func:`block_name`), from the Prefect server."""
    slug, document = block_name(name)
    cls = _block_classes()[slug]
    _quiet_http_requests()
    try:
        # _sync: a plain call also inside a running event loop (a notebook, an async flow)
        return cls.load(document, _sync=True)
    except ValueError as e:
        if "Unable to find block document" not in str(e):
            raise
    from prefect.settings import get_current_settings

    server = get_current_settings().api.url or "the local (ephemeral) Prefect server"
    raise ValueError(
        f"no Prefect block {slug}/{document} on {server}. Create it once: "
        "`prefect block register -m prefect_aws`, then in the UI (Blocks, +) or in Python: "
        f"`from prefect_aws import {cls.__name__}; "
        f"{cls.__name__}(...).save({document!r})`"
    ) from None


def storage_options_from_block(name: str) -> dict[str, Any]:
    """s3fs storage options from the prefect-aws block ``name`` (credentials included:
    hand them to ``Storage`` or ``popflow.run``; never log them or make them parameters)."""
    return options_of(load_block(name))


def storage_url_from_block(name: str, default: str | None = None) -> str:
    """An S3Bucket block's ``s3://<bucket_name>/<bucket_folder>``; ``default`` for a
    credentials block (which names no bucket), an error if there is none."""
    slug, _ = block_name(name)
    if slug != "s3-bucket":
        if default is None:
            raise ValueError(
                f"the block {name!r} holds credentials, not a bucket: give the storage URL "
                "(s3://bucket/prefix), or name an S3Bucket block ('s3-bucket/<name>')"
            )
        return default
    return bucket_url(load_block(name))


def bucket_url(bucket: Any) -> str:
    """``s3://<bucket_name>/<bucket_folder>`` of an S3Bucket block."""
    folder = (bucket.bucket_folder or "").strip("/")
    return f"s3://{bucket.bucket_name}/{folder}" if folder else f"s3://{bucket.bucket_name}"


def options_of(block: Any) -> dict[str, Any]:
    """s3fs options from an AwsCredentials, MinIOCredentials or S3Bucket block (the
    mapping in the module's docstring); only the fields that are set."""
    classes = _block_classes()
    if isinstance(block, classes["s3-bucket"]):
        block = block.credentials
    options: dict[str, Any] = {}
    if isinstance(block, classes["minio-credentials"]):
        options["key"] = block.minio_root_user
        options["secret"] = block.minio_root_password.get_secret_value()
    elif isinstance(block, classes["aws-credentials"]):
        role = getattr(block, "assume_role_arn", None)  # prefect-aws 0.5.x has none
        if role:
            raise ValueError(
                f"the AwsCredentials block sets assume_role_arn {role!r}; "
                "popflow's Dask workers open S3 with static options, so give the block "
                "keys (or a profile_name) instead, or leave the block out and let every "
                "machine's AWS chain assume the role"
            )
        secret = block.aws_secret_access_key
        for option, value in (
            ("key", block.aws_access_key_id),
            ("secret", secret.get_secret_value() if secret is not None else None),
            ("token", block.aws_session_token),
            ("profile", block.profile_name),
        ):
            if value:
                options[option] = value
    else:
        raise TypeError(
            f"{type(block).__name__} is not a prefect-aws AwsCredentials, MinIOCredentials "
            "or S3Bucket block"
        )
    client_kwargs, config_kwargs = _client_options(block.aws_client_parameters)
    if block.region_name:
        client_kwargs["region_name"] = block.region_name
    if client_kwargs:
        options["client_kwargs"] = client_kwargs
    if config_kwargs.get("signature_version") == "unsigned":  # prefect-aws's anonymous access
        del config_kwargs["signature_version"]
        options["anon"] = True
    if config_kwargs:
        options["config_kwargs"] = config_kwargs
    return options


def _client_options(params: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """An AwsClientParameters as s3fs's ``client_kwargs`` and ``config_kwargs``."""
    client: dict[str, Any] = {}
    if params.endpoint_url:
        client["endpoint_url"] = params.endpoint_url
    if params.verify_cert_path:  # wins over verify, as in prefect-aws's own clients
        client["verify"] = str(params.verify_cert_path)
    elif (verify := getattr(params, "verify", None)) is not None:  # not in prefect-aws 0.5.x
        client["verify"] = verify if isinstance(verify, bool) else str(verify)
    if not params.use_ssl:
        client["use_ssl"] = False
    if params.api_version:
        client["api_version"] = params.api_version
    return client, dict(params.config or {})
