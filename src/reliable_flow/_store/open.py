"""Which engine a location names, and opening its store.

A ``postgresql://`` / ``postgres://`` string, a callable (a factory that
returns a psycopg connection), a connection pool (``getconn`` /
``putconn``) or a :class:`PostgresLocation` is PostgreSQL; anything else is
a SQLite file path.  The PostgreSQL engine is imported only when asked for, so
``import reliable_flow`` and every SQLite store work without psycopg.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Union

from .inbox import InboxStore
from .outbox import OutboxStore
from .sqlite import SqliteInboxStore, SqliteOutboxStore
from .sqlite.connection import DEFAULT_BUSY_TIMEOUT

__all__ = ["Location", "PostgresLocation", "is_postgres", "open_inbox", "open_outbox"]

_PG_SCHEMES = ("postgresql://", "postgres://")
#: Where a store lives: a file path, a PostgreSQL URL, a PostgreSQL connection
#: factory or pool, or a PostgresLocation.
Location = Union[str, "os.PathLike[str]", Any]


@dataclass(frozen=True)
class PostgresLocation:
    """A PostgreSQL store, spelt out: what gives the connection, and the schema.

    ``connect``: a ``postgresql://`` connection string, a function returning
    a ``psycopg.Connection``, or a pool (``psycopg_pool.ConnectionPool``, or
    anything with ``getconn()`` and ``putconn(conn)``).  The store takes one
    connection for its whole life and closes it, or gives it back to the
    pool (its session settings reset), on ``close()``.  ``schema``: the
    store's schema; default the string's ``#fragment``, else
    ``reliable_flow_producer`` / ``reliable_flow_consumer``.  A plain string,
    factory or pool works as a location too; this class is for a factory or
    a pool with a schema of its own (e.g. two consumers in one database).
    """

    connect: Any
    schema: str | None = None

    def __post_init__(self) -> None:
        target = self.connect
        if isinstance(target, str):
            if not target.startswith(_PG_SCHEMES):
                raise ValueError(f"connect must be a postgresql:// string, a factory or a pool, got {target!r}")
        elif not (callable(target) or _is_pool(target)) or isinstance(target, os.PathLike):
            raise TypeError(f"connect must be a postgresql:// string, a factory or a pool, got {target!r}")
        if self.schema is not None and (not isinstance(self.schema, str) or not self.schema.strip()):
            raise ValueError(f"schema must be a non-empty string or None, got {self.schema!r}")


def _is_pool(target: object) -> bool:
    return callable(getattr(target, "getconn", None)) and callable(getattr(target, "putconn", None))


def is_postgres(location: object) -> bool:
    """True for a ``postgresql://`` / ``postgres://`` string, a connection
    factory, a pool or a :class:`PostgresLocation`."""
    if isinstance(location, str):
        return location.startswith(_PG_SCHEMES)
    if isinstance(location, PostgresLocation) or _is_pool(location):
        return True
    return callable(location) and not isinstance(location, os.PathLike)


def _target(location: Location) -> tuple[Any, str | None]:
    if isinstance(location, PostgresLocation):
        return location.connect, location.schema
    return location, None


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
        target, schema = _target(location)
        store: OutboxStore = _postgres().PgOutboxStore(
            target, protocol, busy_timeout=busy_timeout, readonly=readonly, schema=schema
        )
        return store
    return SqliteOutboxStore(location, protocol, busy_timeout=busy_timeout, readonly=readonly)


def open_inbox(location: Location, protocol: str | None, *, name: str | None = None,
               default_name: str = "default", busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
               readonly: bool = False) -> InboxStore:
    """The consumer's store at ``location`` (``busy_timeout``: PostgreSQL's ``lock_timeout``)."""
    if is_postgres(location):
        target, schema = _target(location)
        store: InboxStore = _postgres().PgInboxStore(
            target, protocol, name=name, default_name=default_name, busy_timeout=busy_timeout,
            readonly=readonly, schema=schema,
        )
        return store
    return SqliteInboxStore(location, protocol, name=name, default_name=default_name, busy_timeout=busy_timeout,
                            readonly=readonly)
