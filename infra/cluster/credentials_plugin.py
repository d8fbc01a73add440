"""Storage credentials to a run's Dask workers, outside every pickle of a segment.

A :class:`~popflow.infra.storage.folder.Storage` pickles without its credentials: a
token names them (:class:`~popflow.infra.storage.credentials.StorageOptions`). The
driver gives its workers what the token names through a worker plugin of the run's
own (:func:`credentials_on_workers`): Dask runs its ``setup`` on every worker there
and on each that joins or restarts later, before that worker runs anything of the
run, and its ``teardown`` when the run ends. The credentials then live in the
workers' memory and the scheduler's (which keeps the plugin for workers to come),
never in a segment's pickle, a log or a file.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from distributed import Client
from distributed.diagnostics.plugin import WorkerPlugin

from popflow.infra.storage.credentials import StorageOptions, forget, remember

logger = logging.getLogger(__name__)


class CredentialsPlugin(WorkerPlugin):
    """Teaches a worker the credentials ``token`` names (a plain dict: this plugin is the
    one channel they travel by)."""

    def __init__(self, token: str, values: dict[str, Any]) -> None:
        self.token = token
        self.values = values

    def __repr__(self) -> str:  # never the values
        return f"CredentialsPlugin({self.token!r})"

    def setup(self, worker: Any) -> None:
        remember(self.token, self.values)

    def teardown(self, worker: Any) -> None:
        forget(self.token)


@contextmanager
def credentials_on_workers(
    client: Client, options: StorageOptions | Mapping[str, Any]
) -> Iterator[None]:
    """While inside, ``client``'s workers (those there and those to come) know the
    credentials of ``options`` (a run's storage options); nothing is sent for options
    without any."""
    options = StorageOptions(options)
    token = options.token
    if token is None:
        yield
        return
    name = f"popflow-credentials-{uuid.uuid4().hex}"
    client.register_plugin(CredentialsPlugin(token, options.secrets()), name=name)
    try:
        yield
    finally:
        try:
            # a client that lost its scheduler waits for it (30 s) before it fails the call;
            # the workers went with the scheduler, and the plugin with them
            if client.status == "running":
                client.unregister_worker_plugin(name)
        except Exception as e:  # the cluster is going or gone: its workers with it
            logger.debug("could not take the credentials plugin back: %s", e)
