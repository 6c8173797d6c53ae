"""Which engine a location names, and opening its store.

A ``postgresql://`` / ``postgres://`` string or a callable (a factory that
returns a psycopg connection) is PostgreSQL; anything else is a SQLite file
path.  The PostgreSQL engine is imported only when asked for, so
``import reliable_flow`` and every SQLite store work without psycopg.
"""

from __future__ import annotations

import os
from typing import Any, Union

from .inbox import InboxStore
from .outbox import OutboxStore
from .sqlite import SqliteInboxStore, SqliteOutboxStore
from .sqlite.connection import DEFAULT_BUSY_TIMEOUT

__all__ = ["Location", "is_postgres", "open_inbox", "open_outbox"]

_PG_SCHEMES = ("postgresql://", "postgres://")
#: Where a store lives: a file path, a PostgreSQL URL, or a PostgreSQL connection factory.
Location = Union[str, "os.PathLike[str]", Any]


def is_postgres(location: object) -> bool:
    """True for a ``postgresql://`` / ``postgres://`` string or a connection factory."""
    if isinstance(location, str):
        return location.startswith(_PG_SCHEMES)
    return callable(location) and not isinstance(location, os.PathLike)


def _postgres() -> Any:
    try:
        from . import postgres
    except ImportError as exc:  # psycopg missing: say how to get it
        raise ImportError(
            'a PostgreSQL location needs the postgres extra: pip install "reliable_flow[postgres]"'
        ) from exc
    return postgres


def open_outbox(location: Location, protocol: str | None, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
                readonly: bool = False) -> OutboxStore:
    """The producer's store at ``location`` (``busy_timeout``: PostgreSQL's ``lock_timeout``)."""
    if is_postgres(location):
        store: OutboxStore = _postgres().PgOutboxStore(
            location, protocol, busy_timeout=busy_timeout, readonly=readonly
        )
        return store
    return SqliteOutboxStore(location, protocol, busy_timeout=busy_timeout, readonly=readonly)


def open_inbox(location: Location, protocol: str | None, *, name: str | None = None,
               default_name: str = "default", busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
               readonly: bool = False) -> InboxStore:
    """The consumer's store at ``location`` (``busy_timeout``: PostgreSQL's ``lock_timeout``)."""
    if is_postgres(location):
        store: InboxStore = _postgres().PgInboxStore(
            location, protocol, name=name, default_name=default_name, busy_timeout=busy_timeout,
            readonly=readonly,
        )
        return store
    return SqliteInboxStore(location, protocol, name=name, default_name=default_name, busy_timeout=busy_timeout,
                            readonly=readonly)
