"""The console's reads on PostgreSQL can be answered from their indexes
(issue 31, item 5): with sequential scans priced out, each statement's plan
names the index it was written for.  On tables this small the planner would
rather scan; what matters is that the index matches the statement (an
expression index only serves a query that writes the same expression), as
tests/sqlite/test_query_plans.py checks on SQLite."""

from __future__ import annotations

from typing import Any

import pytest

from pg_cluster import import_psycopg, pg_location

psycopg = import_psycopg()  # skips saying what to install (fails under RELIABLE_FLOW_REQUIRE_POSTGRES)

from reliable_flow._store.postgres import PgInboxStore, PgOutboxStore
from reliable_flow._store.postgres.inbox_sql import PgInboxSql
from reliable_flow._store.postgres.outbox_sql import PgOutboxSql

pytestmark = pytest.mark.postgres

_LIST = PgInboxSql.EFFECT_LIST + " LIMIT %s"
CONSUMER_READS = [
    ("flows_by_correlation", PgInboxSql.FLOWS_BY_CORRELATION, ("order-7", 10), "inbox_correlation"),
    ("waiting_flows", PgInboxSql.WAITING_FLOWS, ("", 1e9, 10), "inbox_open"),
    ("effects by state", _LIST.format(where="WHERE state = %s"), ("dead", 10), "effect_by_state"),
    ("effects by name", _LIST.format(where="WHERE name = %s"), ("bill", 10), "effect_by_name"),
    ("effects by state and name", _LIST.format(where="WHERE state = %s AND name = %s"), ("dead", "bill", 10),
     "effect_by_state_name"),
    ("effects of a flow", _LIST.format(where="WHERE flow_id = %s"), ("F", 10), "effect_by_flow"),
    ("effects after a key", _LIST.format(where="WHERE name = %s AND " + PgInboxSql.EFFECT_AFTER),
     ("bill", "k", 10), "effect_by_name"),
]
PRODUCER_READS = [
    ("set_aside", PgOutboxSql.SET_ASIDE, (10,), "delivery_set_aside"),
    ("pending_summary", PgOutboxSql.PENDING_SUMMARY, (0.0, "c", 10), "delivery_due"),
    ("oldest_pending", PgOutboxSql.OLDEST_PENDING, ("c",), "delivery_due"),
]


def _plan(location: str, sql: str, params: tuple[Any, ...]) -> str:
    with psycopg.connect(location.partition("#")[0], autocommit=True) as conn:
        conn.execute("SELECT set_config('search_path', quote_ident(%s), false)", (location.partition("#")[2],))
        conn.execute("SET enable_seqscan = off")
        return "\n".join(str(r[0]) for r in conn.execute("EXPLAIN " + sql, params).fetchall())


@pytest.mark.parametrize("what, sql, params, index", CONSUMER_READS, ids=[r[0] for r in CONSUMER_READS])
def test_a_console_read_of_the_consumer_names_its_index(pg_cluster: Any, what: str, sql: str,
                                                         params: tuple[Any, ...], index: str) -> None:
    location = pg_location("plans_c")
    PgInboxStore(location, "p").close()
    assert index in _plan(location, sql, params)


@pytest.mark.parametrize("what, sql, params, index", PRODUCER_READS, ids=[r[0] for r in PRODUCER_READS])
def test_a_console_read_of_the_producer_names_its_index(pg_cluster: Any, what: str, sql: str,
                                                         params: tuple[Any, ...], index: str) -> None:
    location = pg_location("plans_p")
    PgOutboxStore(location, "p").close()
    assert index in _plan(location, sql, params)
