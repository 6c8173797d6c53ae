"""Reading a store of either engine in the tests, for what the public API has
no accessor for.

Not collected by pytest (no ``test_`` prefix).  A location is a SQLite path
or a ``postgresql://...#schema`` string (as ``tests/pg_cluster.pg_location``
makes them):

* :func:`is_pg`: which engine a location names; :func:`new_location`: a
  fresh one of either engine; :func:`store_exists`: whether anything was
  created there;
* :func:`rows`: the rows of one read-only query (``?`` placeholders on both
  engines; on PostgreSQL in the location's schema, through a short-lived
  connection of its own); :func:`count`: a table's row count;
* :func:`execute`: statements run and committed on a connection of their own
  (the statements themselves are the engine's SQL); :func:`reject_inserts` /
  :func:`allow_inserts`: a trigger failing a table's inserts with the
  engine's :func:`integrity_error`, to inject an SQL failure;
* :func:`effect_counts`, :func:`bodies`: the per-event effect count and the
  stored bodies;
* :func:`contents`: all a store holds (file bytes, or every table's rows), to
  show that a reader wrote nothing;
* :func:`snapshot_of`: :func:`reliable_flow.snapshot`'s picture of two
  stores, each a SQLite file or a PostgreSQL location (``snapshot`` opens
  both engines, read only).
"""

from __future__ import annotations

import os
import sqlite3
from collections import Counter
from typing import Any

import pytest

from reliable_flow import snapshot
from support import sql_execute, sql_rows

__all__ = ["ENGINES", "allow_inserts", "bodies", "contents", "count", "effect_counts", "execute", "integrity_error", "is_pg", "new_location", "reject_inserts", "rows", "snapshot_of", "store_exists"]

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


def count(location: Any, table: str) -> int:
    """How many rows ``table`` holds, on the location's own engine."""
    return int(rows(location, f'SELECT count(*) FROM "{table}"')[0][0])


def execute(location: Any, *statements: str) -> None:
    """Run ``statements`` in order, each committed on its own, through a
    connection of its own on the location's engine (an operator's or a
    test's direct write: a trigger, a repair)."""
    if not is_pg(location):
        sql_execute(location, *statements)
        return
    import psycopg

    url, _, schema = location.partition("#")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT set_config('search_path', quote_ident(%s), false)", (schema,))
        for statement in statements:
            conn.execute(statement)


def store_exists(location: Any) -> bool:
    """Whether anything was created at the location: the SQLite file, or the PostgreSQL schema."""
    if not is_pg(location):
        return os.path.exists(location)
    schema = location.partition("#")[2]
    return bool(rows(location, "SELECT count(*) FROM information_schema.schemata WHERE schema_name = ?",
                     (schema,))[0][0])


def integrity_error(location: Any) -> type[Exception]:
    """What the location's engine raises for a violated constraint (and for
    :func:`reject_inserts`): ``sqlite3.IntegrityError`` or ``psycopg.IntegrityError``."""
    if not is_pg(location):
        return sqlite3.IntegrityError
    import psycopg

    return psycopg.IntegrityError


def reject_inserts(location: Any, table: str, message: str, when: str | None = None) -> None:
    """Install a trigger that fails every INSERT into ``table`` (only those
    where ``when`` holds, an SQL condition on ``NEW`` both engines read the
    same, e.g. ``"NEW.event_id = 'B1'"``) with ``message``: an
    :func:`integrity_error` on either engine.  :func:`allow_inserts` removes it."""
    condition = f"WHEN ({when}) " if when else ""
    if not is_pg(location):
        sql_execute(location, f"CREATE TRIGGER reject_{table} BEFORE INSERT ON {table} {condition}"
                              f"BEGIN SELECT RAISE(ABORT, '{message}'); END;")
        return
    execute(
        location,
        f"CREATE FUNCTION reject_{table}() RETURNS trigger LANGUAGE plpgsql AS "
        f"$$BEGIN RAISE EXCEPTION '{message}' USING ERRCODE = 'check_violation'; END$$",
        f"CREATE TRIGGER reject_{table} BEFORE INSERT ON {table} FOR EACH ROW {condition}"
        f"EXECUTE FUNCTION reject_{table}()",
    )


def allow_inserts(location: Any, table: str) -> None:
    """Remove the trigger of :func:`reject_inserts`."""
    if not is_pg(location):
        sql_execute(location, f"DROP TRIGGER reject_{table}")
        return
    execute(location, f"DROP TRIGGER reject_{table} ON {table}", f"DROP FUNCTION reject_{table}()")


def effect_counts(consumer: Any) -> Counter[str]:
    """Effect records per event id (the UNIQUE constraint keeps it at one; this proves it)."""
    return Counter({str(e): int(n) for e, n in rows(consumer, "SELECT event_id, count(*) FROM effect GROUP BY event_id")})


def bodies(location: Any, table: str) -> dict[str, str]:
    """event_id -> stored body of ``outbox`` (producer) or ``inbox`` (consumer)."""
    assert table in ("outbox", "inbox"), table
    return {str(e): str(b) for e, b in rows(location, f"SELECT event_id, body FROM {table}")}


def contents(location: Any) -> Any:
    """What a store holds, to show that a reader wrote nothing: a SQLite file's
    bytes (its digest; and no write-ahead log holding a frame: a read-only
    reader may leave an empty -wal behind), or every row of every table of a
    PostgreSQL schema."""
    if not is_pg(location):
        from pathlib import Path

        from support import digest

        wal = f"{os.fspath(location)}-wal"
        assert not os.path.exists(wal) or os.path.getsize(wal) == 0, f"{wal} holds writes"
        return digest(Path(location))
    tables = [t for (t,) in rows(location, "SELECT table_name FROM information_schema.tables "
                                           "WHERE table_schema = current_schema() ORDER BY 1")]
    return {t: sorted(map(repr, rows(location, f'SELECT * FROM "{t}"'))) for t in tables}


def snapshot_of(producer: Any, consumer: Any) -> dict[str, Any]:
    """The ``snapshot()`` dict of a producer store and a consumer store of either engine."""
    return snapshot(producer if is_pg(producer) else os.fspath(producer),
                    consumer if is_pg(consumer) else os.fspath(consumer))
