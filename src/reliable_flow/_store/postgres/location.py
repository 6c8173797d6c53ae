"""Where a PostgreSQL store lives: a connection string and a schema.

A location is ``postgresql://...`` (or ``postgres://...``) with the schema
as the URL fragment: ``postgresql:///rf?host=/run/pg#orders_outbox``.
Without a fragment the schema is ``reliable_flow_producer`` (outbox) or
``reliable_flow_consumer`` (inbox).  The fragment is removed before
connecting.  A callable returning a ``psycopg.Connection`` (a factory, e.g.
a pool's ``getconn``) may stand for the connection string; the location
shown is then built from the connection's own parameters.
"""

from __future__ import annotations

import hashlib
import re
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

__all__ = [
    "DEFAULT_SCHEMAS",
    "ConnectionFactory",
    "Location",
    "is_pool",
    "is_postgres_location",
    "lock_key",
    "parse",
    "shown_from",
]

#: The schema each kind uses when the location names none.
DEFAULT_SCHEMAS = {"producer": "reliable_flow_producer", "consumer": "reliable_flow_consumer"}
_SCHEMES = ("postgresql://", "postgres://")
ConnectionFactory = Callable[[], "psycopg.Connection[Any]"]
Target = str | ConnectionFactory | Any  # Any: a pool (getconn / putconn)


def is_postgres_location(location: object) -> bool:
    """True for a ``postgresql://`` / ``postgres://`` string, a connection factory or a pool."""
    if isinstance(location, str):
        return location.startswith(_SCHEMES)
    return callable(location) or is_pool(location)


@dataclass(frozen=True)
class Location:
    """A parsed location: what to connect to, and the schema of the store."""

    conninfo: str | None  # None when a factory makes the connections
    factory: ConnectionFactory | None
    schema: str
    shown: str  # for messages: the password left out
    # A pool's putconn: the connection goes back to it instead of being closed.
    release: Callable[[psycopg.Connection[Any]], None] | None = None

    def give_back(self, conn: psycopg.Connection[Any]) -> None:
        """Close the connection, or hand it back to the pool it came from with
        the session settings the store made undone."""
        if self.release is None or conn.closed:
            conn.close()
            return
        try:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.rollback()
            conn.execute("RESET ALL")
        except psycopg.Error:
            conn.close()  # the pool sees a closed connection and replaces it
        self.release(conn)

    def connect(self) -> psycopg.Connection[Any]:
        if self.factory is not None:
            conn = self.factory()
            if not isinstance(conn, psycopg.Connection):
                raise TypeError(f"the connection factory returned {type(conn).__name__}, not a psycopg.Connection")
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                conn.rollback()
            conn.autocommit = True
            return conn
        assert self.conninfo is not None
        return psycopg.connect(self.conninfo, autocommit=True)


def _check_schema(schema: str) -> str:
    if not schema or len(schema.encode()) > 63 or "\x00" in schema or schema.lower().startswith("pg_"):
        raise ValueError(
            f"schema must be a PostgreSQL identifier of 1 to 63 bytes not starting with 'pg_', got {schema!r}"
        )
    return schema


def _shown(url: str, schema: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.password is not None:
        netloc = parts.netloc.rsplit("@", 1)
        user = netloc[0].split(":", 1)[0]
        url = urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))
    if re.search(r"(?:^|&)password=", parts.query, flags=re.IGNORECASE):
        # libpq takes the password as a query parameter too: left out just the same
        query = re.sub(r"(^|&)(password=)[^&]*", r"\1\2***", parts.query, flags=re.IGNORECASE)
        url = urllib.parse.urlunsplit(urllib.parse.urlsplit(url)._replace(query=query))
    return f"{url}#{urllib.parse.quote(schema, safe='')}"


def parse(target: Target, kind: str, schema: str | None = None) -> Location:
    """The :class:`Location` of ``target`` for a store of ``kind``; ``schema``
    (if given) wins over the fragment."""
    if isinstance(target, str):
        if not target.startswith(_SCHEMES):
            raise ValueError(f"a PostgreSQL location starts with postgresql:// or postgres://, got {target!r}")
        url, _, fragment = target.partition("#")
        chosen = _check_schema(schema or urllib.parse.unquote(fragment) or DEFAULT_SCHEMAS[kind])
        return Location(url, None, chosen, _shown(url, chosen))
    chosen = _check_schema(schema or DEFAULT_SCHEMAS[kind])
    if is_pool(target):
        # A pool (psycopg_pool.ConnectionPool): one connection for the store's
        # life, given back on close().
        pool: Any = target
        return Location(None, pool.getconn, chosen, "", pool.putconn)
    if callable(target):
        # Shown once connected (see shown_from): a factory is not called here.
        return Location(None, target, chosen, "")
    raise TypeError(
        f"a PostgreSQL location is a connection string, a connection factory or a pool, got {target!r}"
    )


def is_pool(target: object) -> bool:
    """True for a connection pool: an object with ``getconn()`` and ``putconn(conn)``."""
    return callable(getattr(target, "getconn", None)) and callable(getattr(target, "putconn", None))


def shown_from(conn: psycopg.Connection[Any], schema: str) -> str:
    """A location for messages built from a live connection's parameters."""
    info = conn.info
    host = urllib.parse.quote(info.host, safe="")
    return f"postgresql://{info.user}@/{info.dbname}?host={host}&port={info.port}#{urllib.parse.quote(schema, safe='')}"


def lock_key(*parts: str) -> int:
    """A signed 64-bit advisory lock key for ``parts`` (stable across processes)."""
    digest = hashlib.blake2b("\x1f".join(parts).encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)
