"""Whether storage still shows a driver holds its lease: the driver's own judgement of a
storage outage (:class:`~popflow.infra.store.lease.Lease` asks it after each look).

A lease lapses ``ttl`` after its last renewal. A driver whose looks at storage have failed
and that storage has not answered for a whole ttl can no longer prove it holds the
experiment: a driver on another host may have seen the lease lapse and taken over. It
stops, however the outage ends (an answer that comes after does not undo the lapse). A
driver that only stalled (no look failed) keeps what its next look shows.
"""

from __future__ import annotations

from collections.abc import Callable

from popflow.infra.storage.errors import StorageError


class LeaseProof:
    """When storage last answered a look at the lease (the lease's clock), and since when
    looks fail (None: the last one answered)."""

    def __init__(self, ttl_s: float, clock: Callable[[], float]) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self.proven = clock()
        self.failing: float | None = None

    def taken(self) -> None:
        """The lease was just created: proven now."""
        self.proven, self.failing = self.clock(), None

    def answered(self) -> str | None:
        """A look was answered: proven now, or why the lease is lost (storage failed and
        did not answer for a whole ttl before this answer)."""
        now = self.clock()
        if self.failing is not None and now - self.proven >= self.ttl_s:
            return (
                f"storage did not answer for {now - self.proven:.0f} s, longer than its "
                f"lease ({self.ttl_s:g} s): another driver may hold the experiment now"
            )
        self.proven, self.failing = now, None
        return None

    def failed(self, error: StorageError) -> str | None:
        """A look failed for good: why the lease is lost once storage has not answered
        for a whole ttl, else None (the outage may still end in time)."""
        now = self.clock()
        if self.failing is None:
            self.failing = now
        if now - self.proven < self.ttl_s:
            return None
        return (
            f"storage has not answered for {now - self.proven:.0f} s, longer than its lease "
            f"({self.ttl_s:g} s): another driver may hold the experiment now (last: "
            f"{error.reason})"
        )

    def within(self, seconds: float) -> bool:
        """Storage answered a look within the last ``seconds``."""
        return self.clock() - self.proven <= seconds
