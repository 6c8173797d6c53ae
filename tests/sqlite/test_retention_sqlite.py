"""Retention, the SQLite-only part (moved from ``tests/test_retention.py``,
which runs on both engines): v3 files upgraded in place (``PRAGMA
user_version``), and the retention queries' SQLite query plans.
"""

from __future__ import annotations

from pathlib import Path

from reliable_flow import Consumer, Producer
from reliable_flow import _envelope as envelope
from reliable_flow._store.sqlite.connection import Database
from reliable_flow._store.sqlite.schema import CONSUMER, PRODUCER, FileKind
from reliable_flow.reservation import RESERVATION
from support import KINDS, Clock, relay_log, sql_pragma, sql_rows


def body(event_id: str, flow_id: str, seq: int, amount: int = 3) -> str:
    return envelope.make(event_id=event_id, flow_id=flow_id, seq=seq, kind=KINDS[seq - 1], schema=1,
                         payload={"amount": amount}).body


def _v3(path: Path, kind: FileKind, meta: list[tuple[str, str]]) -> Database:
    old = FileKind(kind.name, kind.application_id, kind.migrations[:3])
    return Database(path, old, on_create=lambda conn: conn.executemany(
        "INSERT INTO meta(key, value) VALUES (?, ?)", meta))


def test_a_v3_producer_file_upgrades_and_its_old_events_count_as_old(tmp_path: Path) -> None:
    p_path, c_path = tmp_path / "p.db", tmp_path / "c.db"
    with Consumer(c_path, RESERVATION) as c:
        uid = c.uid
    db = _v3(p_path, PRODUCER, [("protocol", "reservation")])
    with db.write() as conn:
        conn.execute("INSERT INTO flow VALUES ('A', 2, 'confirmed', '{\"amount\":3}')")
        conn.executemany("INSERT INTO outbox(event_id, flow_id, seq, body) VALUES (?, 'A', ?, ?)",
                         [("A1", 1, body("A1", "A", 1)), ("A2", 2, body("A2", "A", 2))])
        conn.execute("INSERT INTO consumer(name, uid) VALUES ('default', ?)", (uid,))
        conn.execute("INSERT INTO delivery(consumer, pos, state, last_status, attempts) VALUES "
                     "('default', 1, 'accepted', 'accepted', 1), ('default', 2, 'pending', NULL, 0)")
    db.close()
    assert sql_pragma(p_path, "user_version") == 3
    with Producer(p_path, RESERVATION) as p, Consumer(c_path, RESERVATION) as c:
        assert sql_pragma(p_path, "user_version") == PRODUCER.version == 7  # v5: prunes recorded, v6: topics, v7: the set-aside index
        assert sql_rows(p_path, "SELECT event_id, committed_at FROM outbox ORDER BY pos") == [
            ("A1", None), ("A2", None)]
        assert p.admin.prune(3600, actor="ops", reason="retention").events == 1  # A1: no commit time counts as old; A2 is still pending
        assert p.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "existing"
        relay_log(p, c)
        assert p.admin.prune(3600, actor="ops", reason="retention").events == 1
        r = p.advance("A3", "A", expected_seq=2, kind="released", payload={"amount": 3})
        assert r.status == "committed"
        assert p.admin.prune(3600, actor="ops", reason="retention").events == 0  # A3 has a commit time: young


def test_a_v3_consumer_file_upgrades_and_its_old_rows_can_be_pruned(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    db = _v3(path, CONSUMER, [("protocol", "reservation"), ("name", "default"), ("uid", "u-old")])
    with db.write() as conn:
        conn.executemany(
            "INSERT INTO inbox(event_id, flow_id, seq, body, state, received_at) VALUES (?, ?, ?, ?, ?, ?)", [
                ("A1", "A", 1, body("A1", "A", 1), "applied", None),
                ("A2", "A", 2, body("A2", "A", 2), "applied", 500.0),
                ("A3", "A", 3, body("A3", "A", 3), "pending", 500.0)])
        conn.execute("INSERT INTO projection VALUES ('A', 'confirmed', 2, '{\"amount\":3}', '{\"held\":3}')")
        conn.executemany("INSERT INTO effect(event_id, flow_id, seq, kind) VALUES (?, 'A', ?, ?)",
                         [("A1", 1, "reserved"), ("A2", 2, "confirmed")])
    db.close()
    with Consumer(path, RESERVATION, clock=Clock(1000.0)) as c:
        assert sql_pragma(path, "user_version") == CONSUMER.version == 10  # v7: prunes recorded, v8: the console's indexes, v9: schedules, v10: superseded
        assert c.admin.prune(100, actor="ops", reason="retention").events == 2  # NULL received_at counts as old; A3 is pending
        assert c.receive(body("A1", "A", 1)).status == "duplicate"
        assert c.receive(body("A2", "A", 2, amount=4)).status == "id_conflict"
        assert c.apply_next("A").status == "applied"
        assert [e.event_id for e in c.applied("A")] == ["A3"]


def test_the_retention_queries_and_the_guarded_insert_use_keys_not_scans(tmp_path: Path) -> None:
    from reliable_flow._store.sqlite import inbox_sql, outbox_sql

    Producer(tmp_path / "p.db", RESERVATION).close()
    Consumer(tmp_path / "c.db", RESERVATION).close()

    def plan(path: Path, sql: str, params: tuple[object, ...]) -> str:
        return " | ".join(str(r[3]) for r in sql_rows(path, "EXPLAIN QUERY PLAN " + sql, params))

    insert = plan(tmp_path / "c.db", inbox_sql.INSERT_NEW, ("e", "f", 1, "b", 1.0))
    assert "SEARCH inbox_tombstone USING PRIMARY KEY" in insert and "SEARCH projection" in insert
    outbox = plan(tmp_path / "p.db", outbox_sql.OUTBOX_PRUNABLE, (1.0, 0, "pending", "set_aside", 10))
    assert "SEARCH o USING INTEGER PRIMARY KEY" in outbox and "SEARCH d USING PRIMARY KEY" in outbox
    assert "SEARCH i USING INTEGER PRIMARY KEY" in plan(tmp_path / "c.db", inbox_sql.INBOX_PRUNABLE, (1.0, 10))
    assert "USING INDEX effect_by_state" in plan(tmp_path / "c.db", inbox_sql.EFFECTS_PRUNABLE, (1.0, 10))
