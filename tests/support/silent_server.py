"""A TCP listener on 127.0.0.1 that accepts every connection and never answers: a hung
server (a Prefect API, a Dask scheduler) as a client sees one."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def silent_listener() -> Iterator[int]:
    """Within: the port of a listener that accepts and never answers; closed on exit,
    with every connection it held."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not done.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        done.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()
