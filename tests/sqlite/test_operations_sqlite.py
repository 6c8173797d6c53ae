"""Operating a stuck system, the SQLite-only part (moved from
``tests/test_operations.py``, which runs on both engines): the restored-backup
runbooks of docs/operations.md (a SQLite backup, the file replaced) and the
in-place upgrade of older files (``PRAGMA user_version``, file bytes).
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from reliable_flow import Consumer, InboxState, Producer, relay
from reliable_flow._store.sqlite.connection import Database
from reliable_flow._store.sqlite.schema import CONSUMER, PRODUCER, FileKind
from reliable_flow.errors import UnknownConsumer
from reliable_flow.reservation import RESERVATION
from support import commit, digest, relay_log, run_cli, sql_execute, sql_pragma, sql_rows


def envelope(event_id: str, flow_id: str, seq: int, kind: str, amount: int = 3) -> dict[str, Any]:
    return {"event_id": event_id, "flow_id": flow_id, "seq": seq, "kind": kind, "schema": 1,
            "payload": {"amount": amount}}


def cli_json(*args: str) -> tuple[int, dict[str, Any]]:
    done = run_cli(*args, "--json")
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def digests(*paths: Path) -> dict[str, str]:
    """The database files' bytes, and that no write-ahead log holds a frame (a
    read-only reader of a WAL file may leave an empty -wal and a -shm behind)."""
    for path in paths:
        wal = path.with_name(path.name + "-wal")
        assert not wal.exists() or wal.stat().st_size == 0, f"{wal} holds writes"
    return {path.name: digest(path) for path in paths}


def test_inspect_refuses_a_file_that_needs_an_upgrade_without_writing(tmp_path: Path) -> None:
    p_path, c_path = tmp_path / "p.db", tmp_path / "c.db"
    Producer(p_path, RESERVATION).close()
    _make_v2_consumer(c_path)
    before = digests(c_path)
    done = run_cli("inspect", str(p_path), str(c_path), "--flow", "A")
    assert done.returncode == 2 and "upgrade" in done.stderr
    assert digests(c_path) == before and sql_pragma(c_path, "user_version") == 2


def _backup(source: Path, target: Path) -> None:
    with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(target)) as dst:
        src.backup(dst)


def test_runbook_b_a_producer_restored_from_a_backup_catches_up_from_the_consumer(tmp_path: Path) -> None:
    """docs/operations.md, runbook (b): the consumer has events the producer lost."""
    p_path, c_path, backup = tmp_path / "producer.db", tmp_path / "consumer.db", tmp_path / "backup.db"
    with Producer(p_path, RESERVATION) as p, Consumer(c_path, RESERVATION) as c:
        commit(p, "A", 1)
        relay_log(p, c)
        _backup(p_path, backup)  # last night's backup: A1 only
        p.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"amount": 3}, meta={"by": "web"})
        commit(p, "B", 1)
        relay_log(p, c)
        c.process_all()
    # The producer's disk dies; the backup is restored.
    for f in tmp_path.glob("producer.db*"):
        f.unlink()
    backup.rename(p_path)
    # Reveal, before any writer starts again.
    code, report = cli_json("compare", str(p_path), str(c_path))
    assert code == 1
    kinds = {d["flow_id"]: d["kind"] for d in report["consumers"][0]["differences"]}
    assert kinds == {"A": "ahead", "B": "missing_on_producer"}
    # Fix: re-commit, from the consumer's copies, every event the producer lost.
    with Producer(p_path, RESERVATION) as p, Consumer(c_path, RESERVATION) as c:
        for flow in c.flows():
            for entry in c.inbox(flow):
                if entry.state == InboxState.REPLACED or p.event(entry.event_id) is not None:
                    continue
                e = c.event(entry.event_id)
                assert e is not None
                result = p.advance(e["event_id"], e["flow_id"], expected_seq=e["seq"] - 1, kind=e["kind"],
                                   payload=e["payload"], schema=e["schema"], meta=e.get("meta"))
                assert result.status == "committed", result
        assert sorted(relay_log(p, c)) == ["A2 duplicate", "B1 duplicate"]
        assert p.event("A2") == c.event("A2")
    assert run_cli("compare", str(p_path), str(c_path)).returncode == 0
    assert run_cli("inspect", str(p_path), str(c_path)).returncode == 0


def test_runbook_b_when_writers_already_went_on_the_conflict_is_set_aside_and_skipped(tmp_path: Path) -> None:
    p_path, c_path, backup = tmp_path / "producer.db", tmp_path / "consumer.db", tmp_path / "backup.db"
    with Producer(p_path, RESERVATION) as p, Consumer(c_path, RESERVATION) as c:
        commit(p, "A", 1)
        relay_log(p, c)
        _backup(p_path, backup)
        p.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"amount": 3})
        relay_log(p, c)
        c.process_all()
    for f in tmp_path.glob("producer.db*"):
        f.unlink()
    backup.rename(p_path)
    with Producer(p_path, RESERVATION) as p, Consumer(c_path, RESERVATION) as c:
        # The application wrote again before anyone looked: another event at seq 2.
        p.advance("A2-again", "A", expected_seq=1, kind="confirmed", payload={"amount": 3})
        assert relay_log(p, c) == ["A2-again sequence_conflict"]
    code, report = cli_json("inspect", str(p_path), str(c_path))
    assert code == 1 and [a["kind"] for a in report["attention"]] == ["set_aside"]
    code, report = cli_json("compare", str(p_path), str(c_path))
    assert code == 1 and report["consumers"][0]["differences"][0]["kind"] == "event_differs"
    # Both steps meant the same; the consumer keeps its own: never deliver the copy.
    with Producer(p_path, RESERVATION) as p:
        p.admin.skip("A2-again", consumer="default", actor="carol", reason="restored backup; consumer has A2")
    assert run_cli("inspect", str(p_path), str(c_path)).returncode == 0
    code, report = cli_json("compare", str(p_path), str(c_path))
    assert code == 0
    assert report["consumers"][0]["differences"][0]["explained_by"][0]["actor"] == "carol"


def test_a_restored_producer_lost_a_registration_and_refuses_the_name_until_registered_again(
    tmp_path: Path,
) -> None:
    p_path, backup = tmp_path / "producer.db", tmp_path / "backup.db"
    with Producer(p_path, RESERVATION) as p, Consumer(tmp_path / "c.db", RESERVATION) as c:
        commit(p, "A", 1)
        relay_log(p, c)
        _backup(p_path, backup)
    with Producer(backup, RESERVATION) as p, Consumer(tmp_path / "audit.db", RESERVATION, name="audit") as audit:
        with pytest.raises(UnknownConsumer, match="'audit'"):
            relay(p, audit)
        p.admin.register_consumer("audit", actor="ops", reason="lost with the restore")
        assert relay_log(p, audit) == ["A1 accepted"]


def _make_v2_consumer(path: Path) -> None:
    """A consumer file as the release with schema v2 wrote it: A1 applied, A2
    blocked, B2 waiting at a gap."""
    kind = FileKind("consumer", CONSUMER.application_id, CONSUMER.migrations[:2])
    db = Database(path, kind, on_create=lambda conn: conn.executemany(
        "INSERT INTO meta(key, value) VALUES (?, ?)",
        [("protocol", "reservation"), ("name", "default"), ("uid", "u-old")]))
    body = json.dumps  # the bodies only need to be JSON for these checks
    with db.write() as conn:
        conn.executemany("INSERT INTO inbox(event_id, flow_id, seq, body, state, reason) VALUES (?, ?, ?, ?, ?, ?)", [
            ("A1", "A", 1, body(envelope("A1", "A", 1, "reserved")), "applied", None),
            ("A2", "A", 2, body(envelope("A2", "A", 2, "confirmed", amount=9)), "blocked", "invalid_payload"),
            ("B2", "B", 2, body(envelope("B2", "B", 2, "confirmed")), "pending", None)])
        conn.execute("INSERT INTO projection VALUES ('A', 'reserved', 1, '{\"amount\":3}', '{\"held\":3}')")
        conn.execute("INSERT INTO effect(event_id, flow_id, seq, kind) VALUES ('A1', 'A', 1, 'reserved')")
    db.close()
    assert sql_pragma(path, "user_version") == 2


def test_a_v2_consumer_file_upgrades_in_place_and_its_rows_can_be_skipped_or_replaced(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    _make_v2_consumer(path)
    with Consumer(path, RESERVATION, clock=lambda: 9000.0) as c:
        assert sql_pragma(path, "user_version") == CONSUMER.version
        assert sql_rows(path, "SELECT event_id, state, reason, detail, received_at, blocked_at FROM inbox "
                              "ORDER BY event_id") == [
            ("A1", "applied", None, None, None, None), ("A2", "blocked", "invalid_payload", None, None, None),
            ("B2", "pending", None, None, None, None)]
        stuck = c.stuck("A")
        assert (stuck.wait, stuck.reason, stuck.detail, stuck.since) == ("blocked", "invalid_payload", None, None)
        assert c.stuck("B").since is None  # arrived before arrival times were kept
        c.apply_next("A")  # examined again: now the detail is stored; blocked_at stays unknown
        assert c.stuck("A").detail == "payload.amount: must stay 3 as reserved, got 9"
        c.admin.replace_event("A2", envelope("A2-fix", "A", 2, "confirmed"), actor="ops", reason="after the upgrade")
        assert c.apply_next("A").status == "applied"
        assert (c.name, c.uid) == ("default", "u-old")
    schema = sql_rows(path, "SELECT sql FROM sqlite_master WHERE name = 'inbox'")[0][0]
    assert "'skipped','replaced'" in schema and "received_at" in schema


def test_a_v3_consumer_migration_that_fails_leaves_the_v2_file_intact(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    _make_v2_consumer(path)
    sql_execute(path, "CREATE TABLE consumer_action(note TEXT)")  # left there by someone: the last statement fails
    before = sql_rows(path, "SELECT * FROM inbox ORDER BY event_id")
    with pytest.raises(Exception, match="already exists"):
        Consumer(path, RESERVATION)
    assert sql_pragma(path, "user_version") == 2
    assert sql_rows(path, "SELECT * FROM inbox ORDER BY event_id") == before
    sql_execute(path, "DROP TABLE consumer_action")
    with Consumer(path, RESERVATION) as c:
        assert [e.state for e in c.inbox("A")] == ["applied", "blocked"]


def test_a_v2_producer_file_upgrades_keeping_its_bound_consumers(tmp_path: Path) -> None:
    p_path, c_path = tmp_path / "p.db", tmp_path / "c.db"
    with Consumer(c_path, RESERVATION) as c:
        uid = c.uid
    kind = FileKind("producer", PRODUCER.application_id, PRODUCER.migrations[:2])
    db = Database(p_path, kind, on_create=lambda conn: conn.execute(
        "INSERT INTO meta(key, value) VALUES ('protocol', 'reservation')"))
    from reliable_flow._envelope import make
    bodies = [make(event_id=f"A{n}", flow_id="A", seq=n, kind=k, schema=1, payload={"amount": 3}).body
              for n, k in ((1, "reserved"), (2, "confirmed"))]
    with db.write() as conn:
        conn.execute("INSERT INTO flow VALUES ('A', 2, 'confirmed', '{\"amount\":3}')")
        conn.executemany("INSERT INTO outbox(event_id, flow_id, seq, body) VALUES (?, 'A', ?, ?)",
                         [("A1", 1, bodies[0]), ("A2", 2, bodies[1])])
        conn.execute("INSERT INTO consumer(name, uid) VALUES ('default', ?)", (uid,))
        conn.execute("INSERT INTO delivery(consumer, pos, state, last_status, attempts) VALUES "
                     "('default', 1, 'accepted', 'accepted', 1), ('default', 2, 'pending', NULL, 0)")
    db.close()
    with Producer(p_path, RESERVATION) as p, Consumer(c_path, RESERVATION) as c, \
            Consumer(tmp_path / "new.db", RESERVATION, name="new") as new:
        assert sql_pragma(p_path, "user_version") == PRODUCER.version
        [entry] = p.admin.consumers()
        assert (entry.name, entry.uid, entry.bound, entry.registered_at, entry.backlog) == (
            "default", uid, True, None, 1)
        assert p.admin.registry_actions() == []
        assert relay_log(p, c) == ["A2 accepted"]
        with pytest.raises(UnknownConsumer):
            relay(p, new)  # the upgraded file has a consumer: a new name is no longer implicit
    assert sql_rows(p_path, "SELECT name, uid FROM consumer") == [("default", uid)]
