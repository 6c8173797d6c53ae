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

A consumer on another host, served by ``reliable-flow bridge``, is given
as its location on Redis, ``redis://host:port/db#NAME``: its store is then
read through the bridge (:mod:`reliable_flow.transport.redis._remote`, the
Redis side imported only then), which answers each read from the store on
its host; a bridge that does not answer in time is a ``TransportError``
naming the location.
"""

from __future__ import annotations

import importlib
from typing import cast

from .._core.identity import PROTOCOL_PATH
from .._store.inbox import InboxStore
from .._store.open import Location, is_postgres, open_inbox, open_outbox
from .._store.outbox import OutboxStore

__all__ = ["REMOTE_SCHEMES", "Location", "is_remote", "open_consumer", "open_producer", "recorded_protocol",
           "shown"]

#: How a location on Redis begins (a consumer there is ``URL#NAME``).
REMOTE_SCHEMES = ("redis://", "rediss://", "unix://")


def is_remote(location: object) -> bool:
    """Whether a location is on Redis (a consumer served by a bridge on another host) rather than a store."""
    return isinstance(location, str) and location.startswith(REMOTE_SCHEMES)


def open_producer(location: Location) -> OutboxStore:
    """The producer's store at ``location``, read only."""
    return open_outbox(location, None, readonly=True)


def open_consumer(location: Location) -> InboxStore:
    """The consumer's store at ``location``, read only; for a location on
    Redis (``redis://host:port/db#NAME``), read through the bridge serving it."""
    if is_remote(location):
        try:
            remote = importlib.import_module("reliable_flow.transport.redis._remote")
        except ImportError as exc:
            raise ImportError(f"a consumer on Redis needs the redis extra (pip install "
                              f"'reliable_flow[redis]'): {exc}") from None
        return cast(InboxStore, remote.RemoteInbox(location))
    return open_inbox(location, None, readonly=True)


def shown(location: Location, store: OutboxStore | InboxStore) -> str:
    """How a report names a store: a file path as given; a PostgreSQL
    location as the store shows it (the password left out, a factory's
    connection parameters spelled out)."""
    if is_postgres(location) or is_remote(location):
        return store.location
    return str(location)


def recorded_protocol(store: OutboxStore | InboxStore) -> tuple[str | None, str | None]:
    """The protocol name the store was created for and the import path it
    records (``module:ATTRIBUTE``, or None: see :mod:`reliable_flow._core.identity`)."""
    with store.read() as reads:
        return reads.meta_value("protocol"), reads.meta_value(PROTOCOL_PATH)
