"""The two stores the operator tools read, on either engine, opened read only.

A location is what ``Producer`` / ``Consumer`` take: a SQLite file path, a
``postgresql://...#schema`` string, or a connection factory (see
:mod:`reliable_flow._store.open`).  Read only means: on SQLite ``mode=ro``
(a missing file is :class:`FileNotFoundError`, nothing is created); on
PostgreSQL ``default_transaction_read_only`` on the tool's own connection
(a missing schema is :class:`~reliable_flow.errors.WrongFile`, nothing is
created).  Either way a store of an older schema version is refused until
a ``Producer`` / ``Consumer`` has opened it once, and a store of the other
kind ("swapped" arguments) is refused with ``WrongFile``.
"""

from __future__ import annotations

from .._core.identity import PROTOCOL_PATH
from .._store.inbox import InboxStore
from .._store.open import Location, is_postgres, open_inbox, open_outbox
from .._store.outbox import OutboxStore

__all__ = ["Location", "open_consumer", "open_producer", "recorded_protocol", "shown"]


def open_producer(location: Location) -> OutboxStore:
    """The producer's store at ``location``, read only."""
    return open_outbox(location, None, readonly=True)


def open_consumer(location: Location) -> InboxStore:
    """The consumer's store at ``location``, read only."""
    return open_inbox(location, None, readonly=True)


def shown(location: Location, store: OutboxStore | InboxStore) -> str:
    """How a report names a store: a file path as given; a PostgreSQL
    location as the store shows it (the password left out, a factory's
    connection parameters spelled out)."""
    if is_postgres(location):
        return store.location
    return str(location)


def recorded_protocol(store: OutboxStore | InboxStore) -> tuple[str | None, str | None]:
    """The protocol name the store was created for and the import path it
    records (``module:ATTRIBUTE``, or None: see :mod:`reliable_flow._core.identity`)."""
    with store.read() as reads:
        return reads.meta_value("protocol"), reads.meta_value(PROTOCOL_PATH)
