"""Ways to name a PostgreSQL store: a connection string with the schema as
its fragment, a connection factory or a pool, and ``PostgresLocation`` to
give a factory or a pool a schema of its own."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from pg_cluster import PG_DATABASE, import_psycopg
from reliable_flow import Consumer, PostgresLocation, Producer, relay
from reliable_flow.reservation import RESERVATION

pytestmark = pytest.mark.postgres

psycopg = import_psycopg()  # skips saying what to install (fails under RELIABLE_FLOW_REQUIRE_POSTGRES)
import psycopg_pool

_names = itertools.count(1)


def _schema(label: str) -> str:
    return f"loc_{label}_{next(_names)}"


def test_a_factory_with_a_schema_of_its_own_keeps_two_consumers_apart(pg_cluster: Any) -> None:
    database = pg_cluster.dsn(PG_DATABASE)
    factory = lambda: psycopg.connect(database)
    a_schema, b_schema = _schema("a"), _schema("b")
    with Producer(pg_cluster.dsn(PG_DATABASE, _schema("out")), RESERVATION) as producer, \
            Consumer(PostgresLocation(factory, a_schema), RESERVATION, name="a") as a, \
            Consumer(PostgresLocation(factory, b_schema), RESERVATION, name="b") as b:
        assert a.location.endswith("#" + a_schema) and b.location.endswith("#" + b_schema)
        assert a.uid != b.uid
        for name in ("a", "b"):
            producer.admin.register_consumer(name, actor="test", reason="two consumers in one database")
        producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
        assert relay(producer, a).status == "accepted" and relay(producer, b).status == "accepted"
        assert a.drain("A").applied == 1 and b.drain("A").applied == 1


def test_a_pool_lends_the_store_a_connection_and_gets_it_back_reset(pg_cluster: Any) -> None:
    database = pg_cluster.dsn(PG_DATABASE)
    schema = _schema("pool")
    with psycopg_pool.ConnectionPool(database, min_size=1, max_size=1, open=True) as pool:
        consumer = Consumer(PostgresLocation(pool, schema), RESERVATION)
        try:
            assert pool.get_stats()["pool_available"] == 0  # the store holds the one connection
            assert consumer.receive({"event_id": "A1", "flow_id": "A", "seq": 1, "kind": "reserved",
                                     "schema": 1, "payload": {"amount": 3}}).status == "accepted"
        finally:
            consumer.close()
        assert pool.get_stats()["pool_available"] == 1  # given back, not closed
        with pool.connection() as conn:
            # The store's session settings were reset before it went back.
            assert conn.execute("SHOW search_path").fetchone()[0] == '"$user", public'
            assert conn.execute(f'SELECT count(*) FROM "{schema}".inbox').fetchone()[0] == 1
    # A pool as a plain location gets the side's default schema (in a database
    # of its own: other tests use the defaults of the shared one).
    with psycopg_pool.ConnectionPool(pg_cluster.create_database("rf_pool_defaults"), min_size=1, max_size=1,
                                     open=True) as pool, Producer(pool, RESERVATION) as producer:
        assert producer.location.endswith("#reliable_flow_producer")


@pytest.mark.parametrize("connect, schema, error", [
    ("/tmp/x.db", None, ValueError),
    ("mysql://host/db", None, ValueError),
    (42, None, TypeError),
    (Path("/tmp/x.db"), None, TypeError),
    ("postgresql:///db", "", ValueError),
    ("postgresql:///db", 7, ValueError),
])
def test_a_bad_postgres_location_is_refused_naming_the_field(connect: Any, schema: Any, error: type) -> None:
    with pytest.raises(error, match="connect|schema"):
        PostgresLocation(connect, schema)


@pytest.mark.parametrize("given", [
    "postgresql://ops:pa55word@db.example/app#orders",
    "postgresql:///app?host=/run/pg&password=pa55word&user=ops#orders",
    "postgresql:///app?PASSWORD=pa55word#orders",
])
def test_a_location_is_shown_without_its_password(given: str) -> None:
    from reliable_flow._store.postgres.location import parse

    shown = parse(given, "producer").shown
    assert "pa55word" not in shown and "***" in shown and shown.endswith("#orders")
