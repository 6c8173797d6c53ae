"""Producer files written at schema v1 (one consumer, no leases) upgrade in
place to the current schema and keep working.

The v1 file is built the way the v1 release built it: the first migration
only, through :class:`reliable_flow._store.sqlite.connection.Database`, then filled through raw
SQL with rows in the v1 layout (an accepted, a pending and a set-aside
delivery).  A pinned copy of the v1 DDL makes sure the first migration is
never edited: files in the field were created from exactly that text.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import reliable_flow
from children.racers import open_producer
from reliable_flow import Consumer, DeliveryPolicy, Producer, relay
from reliable_flow import _envelope as envelope
from reliable_flow._store.sqlite.connection import Database
from reliable_flow._store.sqlite.schema import PRODUCER, FileKind
from reliable_flow.errors import SchemaTooNew, StorageError
from reliable_flow.reservation import RESERVATION
from support import (
    KINDS,
    relay_log,
    relay_until_idle,
    sql_execute,
    sql_pragma,
    sql_rows,
    start_on_barrier,
)

V1 = FileKind("producer", PRODUCER.application_id, PRODUCER.migrations[:1])

# sqlite_master of a v1 producer file as the v1 release wrote it (whitespace folded).
V1_SCHEMA = {
    ("table", "meta"): "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    ("table", "flow"): "CREATE TABLE flow( flow_id TEXT PRIMARY KEY, seq INTEGER NOT NULL CHECK (seq >= 1), "
    "state TEXT NOT NULL, data TEXT NOT NULL )",
    ("table", "outbox"): "CREATE TABLE outbox( pos INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL UNIQUE, "
    "flow_id TEXT NOT NULL, seq INTEGER NOT NULL CHECK (seq >= 1), body TEXT NOT NULL, UNIQUE (flow_id, seq) )",
    ("table", "consumer"): "CREATE TABLE consumer( name TEXT PRIMARY KEY, uid TEXT NOT NULL UNIQUE ) WITHOUT ROWID",
    ("table", "delivery"): "CREATE TABLE delivery( consumer TEXT NOT NULL REFERENCES consumer(name), "
    "pos INTEGER NOT NULL REFERENCES outbox(pos), state TEXT NOT NULL DEFAULT 'pending' "
    "CHECK (state IN ('pending','accepted','set_aside')), last_status TEXT, "
    "attempts INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (consumer, pos) ) WITHOUT ROWID",
    ("index", "delivery_pending"): "CREATE INDEX delivery_pending ON delivery(consumer, pos) WHERE state = 'pending'",
    ("table", "sqlite_sequence"): "CREATE TABLE sqlite_sequence(name,seq)",
}


def body(event_id: str, flow_id: str, seq: int, amount: int = 3) -> str:
    return envelope.make(
        event_id=event_id, flow_id=flow_id, seq=seq, kind=KINDS[seq - 1], schema=1, payload={"amount": amount}
    ).body


def schema_of(path: Path) -> dict[tuple[str, str], str]:
    return {
        (t, n): re.sub(r"\s+", " ", sql)
        for t, n, sql in sql_rows(path, "SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL")
    }


def pragmas(path: Path) -> tuple[int, int]:
    return sql_pragma(path, "user_version"), sql_pragma(path, "application_id")


V1_DELIVERIES = [  # consumer, event_id, state, last_status, attempts
    ("default", "A1", "accepted", "accepted", 1),
    ("default", "A2", "pending", None, 0),
    ("default", "B1", "pending", None, 2),
    ("default", "C1", "set_aside", "id_conflict", 1),
]


def make_v1_files(tmp_path: Path) -> tuple[Path, Path]:
    """A v1 producer file (flows A at seq 2, B and C at seq 1) and its consumer.

    The consumer accepted A1 and holds another C1 (the set-aside conflict);
    A2 and B1 were never delivered.
    """
    producer_path, consumer_path = tmp_path / "producer.db", tmp_path / "consumer.db"
    with Consumer(consumer_path, RESERVATION) as consumer:
        assert consumer.receive(body("A1", "A", 1)).status == "accepted"
        assert consumer.receive(body("C1", "C", 1, amount=9)).status == "accepted"
        uid = consumer.uid
    db = Database(
        producer_path, V1,
        on_create=lambda conn: conn.execute("INSERT INTO meta(key, value) VALUES ('protocol', 'reservation')"),
    )
    try:
        with db.write() as conn:
            conn.executemany(
                "INSERT INTO flow(flow_id, seq, state, data) VALUES (?, ?, ?, ?)",
                [("A", 2, "confirmed", '{"amount":3}'), ("B", 1, "reserved", '{"amount":3}'),
                 ("C", 1, "reserved", '{"amount":3}')],
            )
            conn.executemany(
                "INSERT INTO outbox(event_id, flow_id, seq, body) VALUES (?, ?, ?, ?)",
                [("A1", "A", 1, body("A1", "A", 1)), ("A2", "A", 2, body("A2", "A", 2)),
                 ("B1", "B", 1, body("B1", "B", 1)), ("C1", "C", 1, body("C1", "C", 1))],
            )
            conn.execute("INSERT INTO consumer(name, uid) VALUES ('default', ?)", (uid,))
            for name, event_id, state, last_status, attempts in V1_DELIVERIES:
                conn.execute(
                    "INSERT INTO delivery(consumer, pos, state, last_status, attempts) "
                    "SELECT ?, pos, ?, ?, ? FROM outbox WHERE event_id = ?",
                    (name, state, last_status, attempts, event_id),
                )
    finally:
        db.close()
    assert pragmas(producer_path) == (1, PRODUCER.application_id)
    return producer_path, consumer_path


def v1_content(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    return {
        # The v1 rows (an open may add protocol_path, the protocol's import path, and a
        # producer store's uid: issue 30).
        "meta": sql_rows(path, "SELECT key, value FROM meta WHERE key NOT IN ('protocol_path', 'uid') ORDER BY key"),
        "flow": sql_rows(path, "SELECT * FROM flow ORDER BY flow_id"),
        # The v1 columns (v4 added committed_at, NULL for these rows).
        "outbox": sql_rows(path, "SELECT pos, event_id, flow_id, seq, body FROM outbox ORDER BY pos"),
        "consumer": sql_rows(path, "SELECT name, uid FROM consumer ORDER BY name"),
        "delivery": sql_rows(
            path,
            "SELECT d.consumer, o.event_id, d.state, d.last_status, d.attempts "
            "FROM delivery d JOIN outbox o ON o.pos = d.pos ORDER BY d.pos",
        ),
    }


def test_the_first_migration_is_still_the_released_v1_schema(tmp_path: Path) -> None:
    producer_path, _ = make_v1_files(tmp_path)
    assert schema_of(producer_path) == V1_SCHEMA


def test_a_v1_file_upgrades_in_place_and_every_row_survives(tmp_path: Path) -> None:
    producer_path, _ = make_v1_files(tmp_path)
    before = v1_content(producer_path)
    assert before["delivery"] == V1_DELIVERIES
    with Producer(producer_path, RESERVATION) as producer:
        assert pragmas(producer_path) == (PRODUCER.version, PRODUCER.application_id)
        assert v1_content(producer_path) == before
        assert sql_rows(producer_path, "SELECT value FROM meta WHERE key = 'protocol_path'") == [
            ("reliable_flow.reservation:RESERVATION",)
        ]
        assert sql_rows(producer_path, "SELECT value FROM meta WHERE key = 'uid'") == [(producer.uid,)]
        # The new columns start neutral: nothing leased, nothing backing off.
        assert sql_rows(producer_path, "SELECT DISTINCT failures, due_at, lease_owner, last_error FROM delivery") == [
            (0, 0.0, None, None)
        ]
        assert producer.admin.operator_actions() == []
        assert producer.flow("A") == {"state": "confirmed", "seq": 2, "amount": 3}
        by_id = {e.event_id: e for e in producer.outbox()}
        assert {k: (e.state, e.last_status) for k, e in by_id.items()} == {
            "A1": ("accepted", "accepted"), "A2": ("pending", None),
            "B1": ("pending", None), "C1": ("set_aside", "id_conflict"),
        }
        assert by_id["B1"].deliveries["default"].attempts == 2
    schema = schema_of(producer_path)
    assert ("index", "delivery_pending") not in schema
    assert ("table", "delivery_v2") not in schema
    assert "lease_owner" in schema[("table", "delivery")] and "'skipped'" in schema[("table", "delivery")]
    assert ("table", "operator_action") in schema
    # Opening again is a no-op.
    with Producer(producer_path, RESERVATION):
        pass
    assert schema_of(producer_path) == schema


def test_an_upgraded_file_keeps_delivering(tmp_path: Path) -> None:
    producer_path, consumer_path = make_v1_files(tmp_path)
    with Producer(producer_path, RESERVATION) as producer, Consumer(consumer_path, RESERVATION) as consumer:
        policy = DeliveryPolicy(lease_seconds=10)
        answers = relay_log(producer, consumer, policy=policy)
        assert answers == ["A2 accepted", "B1 accepted"]  # the pending ones; C1 stays set aside
        assert producer.advance("A3", "A", expected_seq=2, kind="released", payload={"amount": 3}).status == "committed"
        assert relay(producer, consumer, policy=policy).event_id == "A3"
        assert relay(producer, consumer, policy=policy).status == "idle"
        drained = consumer.process_all()
        assert (drained["A"].applied, drained["B"].applied) == (3, 1)
        assert consumer.projection("A") == {"state": "released", "last_seq": 3, "held": 0}
        assert [e.state for e in producer.outbox("C")] == ["set_aside"]

        # A consumer added after the upgrade gets every event, old ones included.
        with Consumer(tmp_path / "audit.db", RESERVATION, name="audit") as audit:
            got = [str(r.event_id) for r in relay_until_idle(producer, audit, policy=policy, register=True)]
            assert sorted(got) == ["A1", "A2", "A3", "B1", "C1"]
            audit.process_all()
            assert audit.projection("C") == {"state": "reserved", "last_seq": 1, "held": 3}

        # The set-aside event left over from v1 can be resolved with the new operator actions.
        sql_execute(
            consumer_path,
            "DELETE FROM projection WHERE flow_id = 'C'",
            "DELETE FROM effect WHERE flow_id = 'C'",
            "DELETE FROM inbox WHERE flow_id = 'C'",
        )
        producer.admin.redeliver("C1", consumer="default", actor="ops", reason="removed the stray C1 after the upgrade")
        assert relay(producer, consumer, policy=policy).event_id == "C1"
        assert [a.action for a in producer.admin.operator_actions("C1")] == ["redeliver"]
        assert all(e.accepted for e in producer.outbox())


@pytest.mark.parametrize(
    "stray",
    [
        "CREATE TABLE delivery_v2(note TEXT)",  # fails at the first statement of the migration
        "CREATE VIEW operator_action AS SELECT 1 AS x",  # fails at the last, after the rebuild
    ],
)
def test_a_migration_that_fails_halfway_leaves_the_v1_file_intact(tmp_path: Path, stray: str) -> None:
    producer_path, consumer_path = make_v1_files(tmp_path)
    sql_execute(producer_path, stray)  # something an operator left in the file
    before_content, before_schema = v1_content(producer_path), schema_of(producer_path)
    with pytest.raises((sqlite3.Error, StorageError), match="already exists"):
        Producer(producer_path, RESERVATION)
    assert pragmas(producer_path) == (1, PRODUCER.application_id)
    assert schema_of(producer_path) == before_schema
    assert v1_content(producer_path) == before_content
    # Once the stray object is gone, the upgrade goes through with the same data.
    sql_execute(producer_path, f"DROP {stray.split()[1]} {stray.split()[2].split('(')[0]}")
    with Producer(producer_path, RESERVATION) as producer, Consumer(consumer_path, RESERVATION) as consumer:
        assert pragmas(producer_path)[0] == PRODUCER.version
        assert v1_content(producer_path) == before_content
        assert relay(producer, consumer).event_id == "A2"


def test_a_file_newer_than_the_code_is_refused_untouched(tmp_path: Path) -> None:
    producer_path, _ = make_v1_files(tmp_path)
    sql_execute(producer_path, f"PRAGMA user_version = {PRODUCER.version + 1}")
    before = v1_content(producer_path)
    with pytest.raises(SchemaTooNew):
        Producer(producer_path, RESERVATION)
    assert pragmas(producer_path)[0] == PRODUCER.version + 1
    assert v1_content(producer_path) == before


def test_four_processes_opening_a_v1_file_at_once_upgrade_it_once(tmp_path: Path) -> None:
    producer_path, _ = make_v1_files(tmp_path)
    before = v1_content(producer_path)
    run = start_on_barrier(open_producer, [(str(producer_path),)] * 4, timeout=120, name="open")
    assert run.values() == [4] * 4  # every process opened it and saw all four events
    assert pragmas(producer_path)[0] == PRODUCER.version
    assert v1_content(producer_path) == before
    assert json.loads(sql_rows(producer_path, "SELECT body FROM outbox WHERE event_id = 'A2'")[0][0])["seq"] == 2


def test_check_constraints_of_new_files_list_exactly_the_enum_values(tmp_path: Path) -> None:
    # Migrations spell their CHECK values out (an old migration must never
    # change), so this is what keeps them equal to the enums the code uses.
    Producer(tmp_path / "p.db", RESERVATION).close()
    reliable_flow.Consumer(tmp_path / "c.db", RESERVATION).close()
    kinds = (("p.db", "delivery", reliable_flow.DeliveryState), ("c.db", "inbox", reliable_flow.InboxState))
    for path, table, enum in kinds:
        ((sql,),) = sql_rows(tmp_path / path, "SELECT sql FROM sqlite_master WHERE name = ?", (table,))
        listed = re.search(r"CHECK \(state IN \(([^)]*)\)\)", sql)
        assert listed is not None, sql
        assert {v.strip(" '") for v in listed.group(1).split(",")} == set(enum.values())
