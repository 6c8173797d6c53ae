"""What every store offers, whichever side it serves: units of work, snapshots,
autocommit reads, and its connection's lifecycle."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol, TypeVar

__all__ = ["Store"]

Reads_co = TypeVar("Reads_co", covariant=True)
Unit_co = TypeVar("Unit_co", covariant=True)


class Store(Protocol[Reads_co, Unit_co]):
    """A side's storage.  A view (unit, snapshot, ``latest``) is valid only
    inside its with-block, or for ``latest`` until the next close / reopen."""

    @property
    def location(self) -> str:
        """Where the store lives (a path, a connection name), for messages."""

    @property
    def latest(self) -> Reads_co:
        """Reads outside a transaction, each seeing the latest commit."""

    def write(self, *, durable: bool = True) -> AbstractContextManager[Unit_co]:
        """A write transaction that holds what it reads (and locks what it
        decides on) until it commits; all of it commits, or none.
        ``durable=False`` may skip the wait for the disk: only for writes
        whose loss is harmless (leases, backoff times, delivery marks that a
        re-send repairs)."""

    def read(self) -> AbstractContextManager[Reads_co]:
        """A read-only snapshot: every read inside sees one commit (an engine
        may take it at the first read rather than at entry)."""

    def close(self) -> None:
        """Release the connection."""

    def reopen(self) -> None:
        """A fresh connection in this process (after ``fork()``)."""
