"""Whether a driver can still prove it holds its lease: its own judgement of a storage
outage (:class:`~popflow.infra.store.lease.Lease` tells it each renewal, and each look or
renewal that failed).

A lease lapses ``ttl`` after its last renewal (a write of its file: a listing that answers
renews nothing). A driver whose storage calls failed and whose lease was not renewed for a
whole ttl can no longer prove it holds the experiment: a driver on another host may have
seen the lease lapse and taken over. It stops, however the outage ends (a renewal that
gets through after does not undo the lapse). A driver that only stalled (nothing failed)
keeps what its next look shows.
"""

from __future__ import annotations

from collections.abc import Callable

from popflow.infra.storage.errors import StorageError


class LeaseProof:
    """When the lease was last renewed (the lease's clock), and since when storage calls
    about it fail (None: none since)."""

    def __init__(self, ttl_s: float, clock: Callable[[], float]) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self.proven = clock()
        self.failing: float | None = None

    def taken(self) -> None:
        """The lease was just created: proven now."""
        self.proven, self.failing = self.clock(), None

    def answered(self) -> str | None:
        """The lease was renewed: proven now, or why it is lost (storage failed, and the
        lease went a whole ttl without a renewal before this one)."""
        now = self.clock()
        if self.failing is not None and now - self.proven >= self.ttl_s:
            return (
                f"its lease was not renewed for {now - self.proven:.0f} s, longer than its "
                f"lease ({self.ttl_s:g} s), storage failing: another driver may hold the "
                "experiment now"
            )
        self.proven, self.failing = now, None
        return None

    def failed(self, error: StorageError) -> str | None:
        """A storage call about the lease failed for good: why the lease is lost once it
        went a whole ttl without a renewal, else None (the outage may still end in time)."""
        now = self.clock()
        if self.failing is None:
            self.failing = now
        if now - self.proven < self.ttl_s:
            return None
        return (
            f"its lease was not renewed for {now - self.proven:.0f} s, longer than its lease "
            f"({self.ttl_s:g} s), storage failing: another driver may hold the experiment "
            f"now (last: {error.reason})"
        )

    def within(self, seconds: float) -> bool:
        """The lease was renewed within the last ``seconds``."""
        return self.clock() - self.proven <= seconds
