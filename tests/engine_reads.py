"""Reading a store of either engine in the tests, for what the public API has
no accessor for.

Not collected by pytest (no ``test_`` prefix).  A location is a SQLite path
or a ``postgresql://...#schema`` string (as ``tests/pg_cluster.pg_location``
makes them):

* :func:`is_pg`: which engine a location names; :func:`new_location`: a
  fresh one of either engine;
* :func:`rows`: the rows of one read-only query (``?`` placeholders on both
  engines; on PostgreSQL in the location's schema, through a short-lived
  connection of its own);
* :func:`effect_counts`, :func:`bodies`: the per-event effect count and the
  stored bodies;
* :func:`snapshot_of`: :func:`reliable_flow.snapshot`'s picture of two
  stores, each a SQLite file or a PostgreSQL location (``snapshot`` opens
  both engines, read only).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pytest

from reliable_flow import snapshot
from support import sql_rows

__all__ = ["ENGINES", "bodies", "effect_counts", "is_pg", "new_location", "rows", "snapshot_of"]

#: The engines a test runs on: ``@pytest.fixture(params=ENGINES)``, or the
#: ``engine`` fixture of conftest.py (the PostgreSQL param carries the
#: ``postgres`` mark).
ENGINES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def new_location(engine: str, tmp_path: Any, label: str) -> str:
    """A fresh store location: a SQLite file under ``tmp_path``, or a new
    PostgreSQL schema (the session's private server must be running: the
    ``engine`` fixture of conftest.py starts it)."""
    if engine == "sqlite":
        return os.path.join(str(tmp_path), f"{label}.db")
    from pg_cluster import pg_location

    return pg_location(label)


def is_pg(location: Any) -> bool:
    return isinstance(location, str) and location.startswith(("postgresql://", "postgres://"))


def rows(location: Any, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The rows of one query, read only, on the location's own engine."""
    if not is_pg(location):
        return sql_rows(location, query, params)
    import psycopg

    url, _, schema = location.partition("#")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT set_config('search_path', quote_ident(%s), false)", (schema,))
        conn.execute("SET default_transaction_read_only = on")
        return [tuple(r) for r in conn.execute(query.replace("?", "%s"), params).fetchall()]


def effect_counts(consumer: Any) -> Counter[str]:
    """Effect records per event id (the UNIQUE constraint keeps it at one; this proves it)."""
    return Counter({str(e): int(n) for e, n in rows(consumer, "SELECT event_id, count(*) FROM effect GROUP BY event_id")})


def bodies(location: Any, table: str) -> dict[str, str]:
    """event_id -> stored body of ``outbox`` (producer) or ``inbox`` (consumer)."""
    assert table in ("outbox", "inbox"), table
    return {str(e): str(b) for e, b in rows(location, f"SELECT event_id, body FROM {table}")}


def snapshot_of(producer: Any, consumer: Any) -> dict[str, Any]:
    """The ``snapshot()`` dict of a producer store and a consumer store of either engine."""
    return snapshot(producer if is_pg(producer) else os.fspath(producer),
                    consumer if is_pg(consumer) else os.fspath(consumer))
