"""A PostgreSQL schema made by something else is refused like a foreign
file: ``WrongFile``, with nothing written, whatever its ``rf_identity``
table looks like (issue 18g: one with other columns was reported as a lost
connection, because the open path closed the connection before it
classified the error)."""

from __future__ import annotations

from typing import Any

import pytest

from reliable_flow import Consumer, Producer
from reliable_flow.errors import WrongFile
from reliable_flow.reservation import RESERVATION

pytestmark = pytest.mark.postgres

psycopg = pytest.importorskip("psycopg")


def _objects(location: str) -> list[tuple[str, str]]:
    """Every relation of the location's schema, with its kind, and the columns of rf_identity."""
    schema = location.partition("#")[2]
    with psycopg.connect(location.partition("#")[0], autocommit=True) as conn:
        return [(str(name), str(kind)) for name, kind in conn.execute(
            "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s ORDER BY c.relname", (schema,)
        ).fetchall()] + [("rf_identity." + str(col), "column") for (col,) in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name = 'rf_identity' ORDER BY ordinal_position", (schema,)
        ).fetchall()]


def _foreign(location: str, columns: str, row: str | None) -> None:
    schema = location.partition("#")[2]
    with psycopg.connect(location.partition("#")[0], autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'CREATE TABLE "{schema}".rf_identity({columns})')
        if row is not None:
            conn.execute(f'INSERT INTO "{schema}".rf_identity VALUES ({row})')


@pytest.mark.parametrize("side", [Producer, Consumer])
@pytest.mark.parametrize("columns, row", [
    ("id INTEGER PRIMARY KEY, owner TEXT", "1, 'someone'"),   # other columns
    ("id INTEGER PRIMARY KEY, owner TEXT", None),             # other columns, no row
    ("product TEXT, kind TEXT", "'reliable_flow', '{kind}'"),  # one of ours missing
    ("product TEXT, kind TEXT, version TEXT", "'reliable_flow', '{kind}', 'one'"),  # not a number
], ids=["other-columns", "other-columns-empty", "no-version", "text-version"])
def test_a_schema_whose_identity_table_is_not_ours_is_refused_with_nothing_written(
    pg_schema_location: str, side: Any, columns: str, row: str | None,
) -> None:
    _foreign(pg_schema_location, columns, None if row is None else row.format(kind=side.__name__.lower()))
    before = _objects(pg_schema_location)
    with pytest.raises(WrongFile, match="refusing to modify it") as refused:
        side(pg_schema_location, RESERVATION)
    assert "connection" not in str(refused.value)
    assert _objects(pg_schema_location) == before  # nothing created, nothing changed


def test_an_sql_error_while_opening_is_reported_as_itself_not_as_a_lost_connection(pg_schema_location: str) -> None:
    # Our identity row, but no meta table: the open fails on an SQL error,
    # which must be classified while the connection is still open.
    _foreign(pg_schema_location, "one BOOLEAN PRIMARY KEY DEFAULT true, product TEXT, kind TEXT, version INTEGER",
             "true, 'reliable_flow', 'producer', 1")
    before = _objects(pg_schema_location)
    with pytest.raises(psycopg.errors.UndefinedTable, match="meta"):
        Producer(pg_schema_location, RESERVATION)
    assert _objects(pg_schema_location) == before
