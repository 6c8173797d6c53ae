"""The PostgreSQL engine: each side in its own schema, all of its SQL in this
folder.  Needs the ``postgres`` extra (psycopg 3); nothing outside this
folder imports psycopg."""

from __future__ import annotations

from .inbox import PgInboxStore
from .location import DEFAULT_SCHEMAS, is_postgres_location
from .outbox import PgOutboxStore

__all__ = ["DEFAULT_SCHEMAS", "PgInboxStore", "PgOutboxStore", "is_postgres_location"]
