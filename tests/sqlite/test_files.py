"""The file layer (db.py): opening, refusing, migrating, transactions, fork and read-only use.

Every refusal must happen before a byte is written, so each refusal test
compares the file's bytes (and the directory listing) before and after.
"""

from __future__ import annotations

import math
import random
import sqlite3
import sys
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

import reliable_flow
from reliable_flow import Consumer, Producer, relay, snapshot
from reliable_flow._store.sqlite.connection import MIN_SQLITE, Database, check_sqlite_version
from reliable_flow._store.sqlite.schema import CONSUMER, PRODUCER, FileKind
from reliable_flow.errors import (
    CommitOutcomeUnknown,
    SchemaTooNew,
    SQLiteTooOld,
    StorageError,
    WrongFile,
    WrongProcess,
)
from reliable_flow.protocol import Protocol, exact, integer
from reliable_flow.records import InboxEntry
from reliable_flow.reservation import RESERVATION
from support import (
    digest,
    envelope,
    in_forked_child,
    sql_count,
    sql_execute,
    sql_pragma,
    sql_rows,
)

OTHER_PROTOCOL = Protocol(
    name="counter",
    initial="idle",
    transitions={"idle": ["running"], "running": ["running", "done"]},
    schemas={1: exact({"n": integer(1, 100)})},
)


# -- helpers ----------------------------------------------------------------------------


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def make_producer_file(path: Path) -> None:
    with Producer(path, RESERVATION) as p:
        assert p.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "committed"


def make_consumer_file(path: Path, name: str | None = None) -> None:
    with Consumer(path, RESERVATION, name=name) as c:
        assert c.receive(envelope("A1", "A", 1)).status == "accepted"


# -- opening a new file -------------------------------------------------------------------


def test_new_producer_file_is_wal_full_sync_and_marked(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    assert not path.exists()
    with Producer(path, RESERVATION) as p:
        assert path.is_file()
        conn = p._store._db.conn
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30_000
        assert conn.isolation_level is None
        assert sql_pragma(path, "journal_mode") == "wal"
        assert sql_pragma(path, "user_version") == PRODUCER.version
        assert sql_pragma(path, "application_id") == PRODUCER.application_id
    # Still a WAL file after a clean close, and still ours.
    assert sql_pragma(path, "journal_mode") == "wal"
    assert sql_pragma(path, "application_id") == PRODUCER.application_id


def test_new_consumer_file_is_wal_full_sync_and_marked(tmp_path: Path) -> None:
    path = tmp_path / "new-consumer.db"
    with Consumer(path, RESERVATION, busy_timeout=2.5) as c:
        conn = c._store._db.conn
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 2_500
        assert sql_pragma(path, "journal_mode") == "wal"
        assert sql_pragma(path, "user_version") == CONSUMER.version
        assert sql_pragma(path, "application_id") == CONSUMER.application_id
        assert c.name == "default"
        assert len(c.uid) == 32


def test_application_ids_differ_and_are_nonzero() -> None:
    assert PRODUCER.application_id != CONSUMER.application_id
    assert 0 not in (PRODUCER.application_id, CONSUMER.application_id)
    assert PRODUCER.version >= 1 and CONSUMER.version >= 1


def test_reopening_keeps_the_data(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    make_producer_file(path)
    with Producer(path, RESERVATION) as p:
        assert p.flow("A") == {"state": "reserved", "seq": 1, "amount": 3}


def test_an_empty_existing_file_is_initialised(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    with Producer(path, RESERVATION) as p:
        assert p.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 1}).status == "committed"
    assert sql_pragma(path, "application_id") == PRODUCER.application_id


# -- refusals ---------------------------------------------------------------------------


def _text_file(path: Path) -> None:
    path.write_text("this is a text file, not a database\n" * 200)


def _random_bytes(path: Path) -> None:
    path.write_bytes(random.Random(1234).randbytes(8192))


def _foreign_db(path: Path) -> None:
    sql_execute(
        path,
        "CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT)",
        "INSERT INTO customers(name) VALUES ('alice'), ('bob')",
    )


def _foreign_db_versioned_no_tables(path: Path) -> None:
    sql_execute(path, "PRAGMA user_version = 7")


def _foreign_db_other_application_id(path: Path) -> None:
    sql_execute(path, "PRAGMA application_id = 1234567")


def _producer_file(path: Path) -> None:
    make_producer_file(path)


def _consumer_file(path: Path) -> None:
    make_consumer_file(path)


def _producer_file_too_new(path: Path) -> None:
    make_producer_file(path)
    sql_execute(path, f"PRAGMA user_version = {PRODUCER.version + 1}")


def _consumer_file_too_new(path: Path) -> None:
    make_consumer_file(path)
    sql_execute(path, f"PRAGMA user_version = {CONSUMER.version + 1}")


def _open_producer(path: Path) -> Producer:
    return Producer(path, RESERVATION)


def _open_consumer(path: Path) -> Consumer:
    return Consumer(path, RESERVATION)


def _open_producer_other_protocol(path: Path) -> Producer:
    return Producer(path, OTHER_PROTOCOL)


def _open_consumer_other_protocol(path: Path) -> Consumer:
    return Consumer(path, OTHER_PROTOCOL)


def _open_consumer_named_other(path: Path) -> Consumer:
    return Consumer(path, RESERVATION, name="other")


REFUSALS = [
    pytest.param(_text_file, _open_producer, WrongFile, id="text-file-as-producer"),
    pytest.param(_text_file, _open_consumer, WrongFile, id="text-file-as-consumer"),
    pytest.param(_random_bytes, _open_producer, WrongFile, id="random-bytes-as-producer"),
    pytest.param(_random_bytes, _open_consumer, WrongFile, id="random-bytes-as-consumer"),
    pytest.param(_foreign_db, _open_producer, WrongFile, id="foreign-db-as-producer"),
    pytest.param(_foreign_db, _open_consumer, WrongFile, id="foreign-db-as-consumer"),
    pytest.param(_foreign_db_versioned_no_tables, _open_producer, WrongFile, id="foreign-db-user-version"),
    pytest.param(_foreign_db_other_application_id, _open_consumer, WrongFile, id="foreign-application-id"),
    pytest.param(_consumer_file, _open_producer, WrongFile, id="consumer-file-as-producer"),
    pytest.param(_producer_file, _open_consumer, WrongFile, id="producer-file-as-consumer"),
    pytest.param(_producer_file_too_new, _open_producer, SchemaTooNew, id="producer-schema-too-new"),
    pytest.param(_consumer_file_too_new, _open_consumer, SchemaTooNew, id="consumer-schema-too-new"),
    pytest.param(_producer_file, _open_producer_other_protocol, WrongFile, id="producer-other-protocol"),
    pytest.param(_consumer_file, _open_consumer_other_protocol, WrongFile, id="consumer-other-protocol"),
    pytest.param(_consumer_file, _open_consumer_named_other, WrongFile, id="consumer-other-name"),
]


@pytest.mark.parametrize(("build", "open_file", "error"), REFUSALS)
def test_refused_file_is_left_byte_for_byte_unchanged(
    tmp_path: Path,
    build: Callable[[Path], None],
    open_file: Callable[[Path], Producer | Consumer],
    error: type[Exception],
) -> None:
    path = tmp_path / "target.db"
    build(path)
    before, files_before = digest(path), listing(tmp_path)
    with pytest.raises(WrongFile) as info:
        opened = open_file(path)
        opened.close()
    assert type(info.value) is error
    assert str(path) in str(info.value)
    assert digest(path) == before
    assert listing(tmp_path) == files_before


def test_foreign_database_keeps_its_journal_mode_and_rows(tmp_path: Path) -> None:
    path = tmp_path / "foreign.db"
    _foreign_db(path)
    assert sql_pragma(path, "journal_mode") == "delete"
    before = digest(path)
    for opener in (_open_producer, _open_consumer):
        with pytest.raises(WrongFile, match="not a reliable_flow"):
            opener(path).close()
    with pytest.raises(WrongFile):
        snapshot(path, path)
    assert digest(path) == before
    assert sql_pragma(path, "journal_mode") == "delete"
    assert sql_pragma(path, "application_id") == 0
    assert sql_rows(path, "SELECT name FROM customers ORDER BY id") == [("alice",), ("bob",)]
    tables = {r[0] for r in sql_rows(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"customers"}


def test_schema_too_new_names_both_versions(tmp_path: Path) -> None:
    path = tmp_path / "p.db"
    _producer_file_too_new(path)
    with pytest.raises(SchemaTooNew) as info:
        Producer(path, RESERVATION).close()
    assert str(PRODUCER.version + 1) in str(info.value)
    assert str(PRODUCER.version) in str(info.value)
    assert isinstance(info.value, WrongFile)
    assert sql_pragma(path, "user_version") == PRODUCER.version + 1


def test_consumer_file_keeps_its_name(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    make_consumer_file(path, name="billing")
    with Consumer(path, RESERVATION) as c:
        assert c.name == "billing"
    with Consumer(path, RESERVATION, name="billing") as c:
        assert c.name == "billing"
    with pytest.raises(WrongFile, match="billing"):
        Consumer(path, RESERVATION, name="default").close()


def test_sqlite_version_check() -> None:
    with pytest.raises(SQLiteTooOld) as info:
        check_sqlite_version((3, 23, 0))
    assert "3.24" in str(info.value)
    assert "3.23.0" in str(info.value)
    with pytest.raises(SQLiteTooOld):
        check_sqlite_version((2, 99, 99))
    check_sqlite_version((3, 24, 0))
    check_sqlite_version((4, 0, 0))
    check_sqlite_version(sqlite3.sqlite_version_info)
    check_sqlite_version()
    assert MIN_SQLITE == (3, 24, 0)


# -- migrations -------------------------------------------------------------------------

APP_ID = 0x52460999
KIND_V1 = FileKind(
    name="custom",
    application_id=APP_ID,
    migrations=(("CREATE TABLE item(id INTEGER PRIMARY KEY, name TEXT NOT NULL)",),),
)
KIND_V2 = FileKind(
    name="custom",
    application_id=APP_ID,
    migrations=KIND_V1.migrations
    + (
        (
            "ALTER TABLE item ADD COLUMN colour TEXT NOT NULL DEFAULT 'red'",
            "CREATE TABLE audit(id INTEGER PRIMARY KEY, note TEXT)",
        ),
    ),
)


@pytest.fixture
def v1_file(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "custom.db"
    db = Database(path, KIND_V1)
    try:
        with db.write() as conn:
            conn.execute("INSERT INTO item(name) VALUES ('first')")
    finally:
        db.close()
    yield path


def test_migration_upgrades_in_place_and_keeps_rows(v1_file: Path) -> None:
    assert sql_pragma(v1_file, "user_version") == 1
    assert sql_pragma(v1_file, "application_id") == APP_ID
    db = Database(v1_file, KIND_V2)
    try:
        conn = db.conn
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 2
        columns = [r[1] for r in conn.execute("PRAGMA table_info(item)")]
        assert columns == ["id", "name", "colour"]
        assert conn.execute("SELECT id, name, colour FROM item").fetchall() == [(1, "first", "red")]
        assert conn.execute("SELECT count(*) FROM audit").fetchone()[0] == 0
    finally:
        db.close()
    assert sql_pragma(v1_file, "application_id") == APP_ID
    # Reopening at the same version changes nothing.
    before = digest(v1_file)
    Database(v1_file, KIND_V2).close()
    assert digest(v1_file) == before
    # The old code now refuses the newer file, without touching it.
    with pytest.raises(SchemaTooNew):
        Database(v1_file, KIND_V1)
    assert digest(v1_file) == before


def test_failed_migration_rolls_back_entirely(v1_file: Path) -> None:
    broken = FileKind(
        name="custom",
        application_id=APP_ID,
        migrations=KIND_V1.migrations + (("CREATE TABLE newer(x)", "THIS IS NOT SQL"),),
    )
    with pytest.raises((sqlite3.Error, StorageError)):
        Database(v1_file, broken)
    assert sql_pragma(v1_file, "user_version") == 1
    tables = {r[0] for r in sql_rows(v1_file, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert sql_rows(v1_file, "SELECT name FROM item") == [("first",)]
    assert "newer" not in tables
    Database(v1_file, KIND_V1).close()


def test_on_create_runs_once_inside_the_creating_transaction(tmp_path: Path) -> None:
    path = tmp_path / "custom.db"
    calls: list[tuple[bool, int]] = []

    def on_create(conn: sqlite3.Connection) -> None:
        tables = conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'item'").fetchone()[0]
        calls.append((conn.in_transaction, tables))

    Database(path, KIND_V1, on_create=on_create).close()
    Database(path, KIND_V1, on_create=on_create).close()
    Database(path, KIND_V2, on_create=on_create).close()
    assert calls == [(True, 1)]


def test_failing_on_create_leaves_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "custom.db"

    def on_create(conn: sqlite3.Connection) -> None:
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        Database(path, KIND_V1, on_create=on_create)
    assert sql_pragma(path, "user_version") == 0
    assert sql_pragma(path, "application_id") == 0
    assert sql_count(path, "sqlite_master") == 0
    Database(path, KIND_V1).close()
    assert sql_pragma(path, "user_version") == 1


def test_readonly_open_refuses_an_old_version_without_upgrading(v1_file: Path) -> None:
    before = digest(v1_file)
    with pytest.raises(WrongFile) as info:
        Database(v1_file, KIND_V2, readonly=True)
    assert type(info.value) is WrongFile
    assert digest(v1_file) == before
    assert sql_pragma(v1_file, "user_version") == 1


def test_readonly_open_cannot_write(v1_file: Path) -> None:
    db = Database(v1_file, KIND_V1, readonly=True)
    try:
        with pytest.raises(sqlite3.Error):
            db.conn.execute("INSERT INTO item(name) VALUES ('x')")
        with db.read() as conn:
            assert conn.execute("SELECT count(*) FROM item").fetchone()[0] == 1
    finally:
        db.close()


def test_create_false_refuses_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.db"
    with pytest.raises(FileNotFoundError):
        Database(path, KIND_V1, create=False)
    assert not path.exists()


# -- a producer file written by the first release ---------------------------------------

PRODUCER_V1 = FileKind(PRODUCER.name, PRODUCER.application_id, PRODUCER.migrations[:1])


def make_v1_producer_file(path: Path, protocol_name: str = "reservation") -> None:
    """A producer file exactly as release 1 (schema version 1) left it: two events of
    flow A, the first accepted by consumer "old", the second still pending."""
    from reliable_flow._envelope import make

    def on_create(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO meta(key, value) VALUES ('protocol', ?)", (protocol_name,))

    db = Database(path, PRODUCER_V1, on_create=on_create)
    try:
        with db.write() as conn:
            conn.execute("INSERT INTO flow VALUES ('A', 2, 'confirmed', '{\"amount\":3}')")
            for seq, kind in ((1, "reserved"), (2, "confirmed")):
                body = make(
                    event_id=f"A{seq}", flow_id="A", seq=seq, kind=kind, schema=1, payload={"amount": 3}
                ).body
                conn.execute(
                    "INSERT INTO outbox(event_id, flow_id, seq, body) VALUES (?, 'A', ?, ?)",
                    (f"A{seq}", seq, body),
                )
            conn.execute("INSERT INTO consumer(name, uid) VALUES ('old', 'uid-of-old')")
            conn.execute(
                "INSERT INTO delivery(consumer, pos, state, last_status, attempts) "
                "VALUES ('old', 1, 'accepted', 'accepted', 1), ('old', 2, 'pending', NULL, 0)"
            )
    finally:
        db.close()


def _needs_newer_producer_schema() -> None:
    if PRODUCER.version < 2:  # pragma: no cover - only while the producer schema has one version
        pytest.skip("the producer schema has a single version; nothing to upgrade")


def test_release_1_producer_file_upgrades_in_place(tmp_path: Path) -> None:
    _needs_newer_producer_schema()
    path = tmp_path / "p.db"
    make_v1_producer_file(path)
    assert sql_pragma(path, "user_version") == 1
    with Producer(path, RESERVATION) as p:
        assert p._store._db.conn.execute("PRAGMA user_version").fetchone()[0] == PRODUCER.version
        assert p.flow("A") == {"state": "confirmed", "seq": 2, "amount": 3}
        states = [(e.event_id, e.deliveries["old"].state) for e in p.outbox("A")]
        assert states == [("A1", "accepted"), ("A2", "pending")]
        assert p.advance("A3", "A", expected_seq=2, kind="released", payload={"amount": 3}).status == "committed"
        with Consumer(tmp_path / "c.db", RESERVATION) as c:
            delivered = [relay(p, c, register=True).status for _ in range(4)]
            assert delivered == ["accepted", "accepted", "accepted", "idle"]
            assert c.drain("A").applied == 3
            assert c.projection("A") == {"state": "released", "last_seq": 3, "held": 0}
    assert sql_pragma(path, "application_id") == PRODUCER.application_id


def test_snapshot_refuses_a_file_that_needs_an_upgrade_without_upgrading_it(tmp_path: Path) -> None:
    _needs_newer_producer_schema()
    p_path, c_path = tmp_path / "p.db", tmp_path / "c.db"
    make_v1_producer_file(p_path)
    make_consumer_file(c_path)
    before = digest(p_path)
    with pytest.raises(WrongFile, match="upgrade"):
        snapshot(p_path, c_path)
    assert digest(p_path) == before
    assert sql_pragma(p_path, "user_version") == 1


def test_release_1_producer_file_with_another_protocol_is_refused_unchanged(tmp_path: Path) -> None:
    _needs_newer_producer_schema()
    path = tmp_path / "p.db"
    make_v1_producer_file(path)
    before = digest(path)
    with pytest.raises(WrongFile, match="protocol"):
        Producer(path, OTHER_PROTOCOL).close()
    assert sql_pragma(path, "user_version") == 1
    assert digest(path) == before


# -- transactions -----------------------------------------------------------------------


@pytest.fixture
def custom_db(v1_file: Path) -> Iterator[Database]:
    db = Database(v1_file, KIND_V1)
    yield db
    db.close()


def test_write_commits_on_normal_exit(custom_db: Database, v1_file: Path) -> None:
    with custom_db.write() as conn:
        assert conn.in_transaction
        conn.execute("INSERT INTO item(name) VALUES ('second')")
    assert not custom_db.conn.in_transaction
    assert sql_count(v1_file, "item") == 2


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt, SystemExit, sqlite3.IntegrityError])
def test_write_rolls_back_on_any_exception(
    custom_db: Database, v1_file: Path, error: type[BaseException]
) -> None:
    with pytest.raises(error), custom_db.write() as conn:
        conn.execute("INSERT INTO item(name) VALUES ('doomed')")
        raise error("boom")
    assert not custom_db.conn.in_transaction
    assert sql_count(v1_file, "item") == 1
    # The connection is usable afterwards.
    with custom_db.write() as conn:
        conn.execute("INSERT INTO item(name) VALUES ('after')")
    assert sql_count(v1_file, "item") == 2


def test_write_rolls_back_after_a_failed_statement(custom_db: Database, v1_file: Path) -> None:
    with pytest.raises(sqlite3.IntegrityError), custom_db.write() as conn:
        conn.execute("INSERT INTO item(name) VALUES ('ok')")
        conn.execute("INSERT INTO item(id, name) VALUES (1, 'clash')")
    assert not custom_db.conn.in_transaction
    assert sql_count(v1_file, "item") == 1


@pytest.mark.skipif(sys.version_info < (3, 11), reason="sqlite_errorname on a raw sqlite3 error needs Python 3.11")
def test_write_takes_the_write_lock_before_the_first_statement(custom_db: Database, v1_file: Path) -> None:
    with closing(sqlite3.connect(v1_file, isolation_level=None, timeout=0)) as other:
        with custom_db.write():
            with pytest.raises(sqlite3.OperationalError) as info:
                other.execute("BEGIN IMMEDIATE")
            assert info.value.sqlite_errorname == "SQLITE_BUSY"
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")


def test_failed_commit_is_reported_as_outcome_unknown_and_rolled_back(tmp_path: Path) -> None:
    kind = FileKind(
        name="custom-fk",
        application_id=APP_ID + 1,
        migrations=(
            (
                "CREATE TABLE parent(id INTEGER PRIMARY KEY)",
                (
                    "CREATE TABLE child(id INTEGER PRIMARY KEY, "
                    "parent INTEGER REFERENCES parent(id) DEFERRABLE INITIALLY DEFERRED)"
                ),
            ),
        ),
    )
    path = tmp_path / "fk.db"
    db = Database(path, kind)
    try:
        db.conn.execute("PRAGMA foreign_keys = ON")
        with pytest.raises(CommitOutcomeUnknown) as info, db.write() as conn:
            conn.execute("INSERT INTO child(id, parent) VALUES (1, 99)")  # checked at COMMIT
        assert isinstance(info.value.__cause__, sqlite3.Error)
        assert isinstance(info.value, StorageError)
        assert not db.conn.in_transaction
        assert db.conn.execute("SELECT count(*) FROM child").fetchone()[0] == 0
    finally:
        db.close()


def test_read_sees_one_snapshot_and_ends_its_transaction(custom_db: Database, v1_file: Path) -> None:
    with custom_db.read() as conn:
        first = conn.execute("SELECT count(*) FROM item").fetchone()[0]
        sql_execute(v1_file, "INSERT INTO item(name) VALUES ('concurrent')")
        assert conn.execute("SELECT count(*) FROM item").fetchone()[0] == first
    assert not custom_db.conn.in_transaction
    assert custom_db.conn.execute("SELECT count(*) FROM item").fetchone()[0] == first + 1


def test_closed_database_raises_storage_error(v1_file: Path) -> None:
    db = Database(v1_file, KIND_V1)
    db.close()
    with pytest.raises(StorageError, match="closed"):
        _ = db.conn
    db.close()  # closing twice is harmless
    db.reopen()
    try:
        assert db.conn.execute("SELECT count(*) FROM item").fetchone()[0] == 1
    finally:
        db.close()


# -- fork -----------------------------------------------------------------------------------


def test_producer_used_in_a_forked_child_raises_wrong_process(producer: Producer) -> None:
    def work() -> str:
        try:
            producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
        except WrongProcess:
            pass
        else:
            return "advance worked in the child"
        try:
            producer.flow("A")
        except WrongProcess as exc:
            return f"WrongProcess: {exc}"
        return "flow worked in the child"

    code, report = in_forked_child(work)
    assert code == 0, report
    assert report.startswith("WrongProcess: "), report
    assert "reopen" in report
    # The parent's object is unaffected and nothing was written by the child.
    assert producer.flow("A") is None
    assert producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "committed"


def test_consumer_used_in_a_forked_child_raises_wrong_process(consumer: Consumer) -> None:
    envelope = {"event_id": "A1", "flow_id": "A", "seq": 1, "kind": "reserved", "schema": 1, "payload": {"amount": 3}}

    def work() -> str:
        try:
            consumer.receive(envelope)
        except WrongProcess as exc:
            return f"WrongProcess: {exc}"
        return "receive worked in the child"

    code, report = in_forked_child(work)
    assert code == 0, report
    assert report.startswith("WrongProcess: "), report
    assert consumer.inbox("A") == []
    assert consumer.receive(envelope).status == "accepted"


def test_producer_reopened_in_a_forked_child_can_advance(producer: Producer, consumer: Consumer) -> None:
    def work() -> str:
        producer.reopen()
        try:
            r = producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
            consumer.reopen()
            try:
                delivered = relay(producer, consumer)
            finally:
                consumer.close()
        finally:
            producer.close()
        return f"{r.status} {r.seq} {delivered.status}"

    code, report = in_forked_child(work)
    assert (code, report) == (0, "committed 1 accepted")
    # The parent's own connections see what the child committed.
    assert producer.flow("A") == {"state": "reserved", "seq": 1, "amount": 3}
    assert producer.outbox("A")[0].accepted is True
    assert consumer.inbox("A") == [InboxEntry(event_id="A1", seq=1, state="pending", reason=None)]
    assert producer.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"amount": 3}).status == "committed"


# -- read-only: snapshot ------------------------------------------------------------------


def test_snapshot_of_a_missing_producer_file_creates_nothing(tmp_path: Path) -> None:
    make_consumer_file(tmp_path / "c.db")
    before, c_hash = listing(tmp_path), digest(tmp_path / "c.db")
    with pytest.raises(FileNotFoundError):
        snapshot(tmp_path / "missing.db", tmp_path / "c.db")
    assert listing(tmp_path) == before
    assert digest(tmp_path / "c.db") == c_hash


def test_snapshot_of_a_missing_consumer_file_creates_nothing(tmp_path: Path) -> None:
    make_producer_file(tmp_path / "p.db")
    before, p_hash = listing(tmp_path), digest(tmp_path / "p.db")
    with pytest.raises(FileNotFoundError):
        snapshot(tmp_path / "p.db", tmp_path / "missing.db")
    assert not any(name.startswith("missing") for name in listing(tmp_path))
    # The producer file was read first: at most its WAL side files may appear.
    assert set(listing(tmp_path)) - set(before) <= {"p.db-wal", "p.db-shm"}
    assert digest(tmp_path / "p.db") == p_hash


def test_snapshot_of_swapped_files_is_refused(tmp_path: Path) -> None:
    make_producer_file(tmp_path / "p.db")
    make_consumer_file(tmp_path / "c.db")
    hashes = digest(tmp_path / "p.db"), digest(tmp_path / "c.db")
    with pytest.raises(WrongFile):
        snapshot(tmp_path / "c.db", tmp_path / "p.db")
    assert (digest(tmp_path / "p.db"), digest(tmp_path / "c.db")) == hashes


def _ledger(producer: Producer, consumer: Consumer) -> None:
    assert producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "committed"
    assert producer.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"amount": 3}).status == "committed"
    assert relay(producer, consumer).status == "accepted"
    assert consumer.apply_next("A").status == "applied"


def test_snapshot_of_closed_files_changes_no_byte(tmp_path: Path) -> None:
    p_path, c_path = tmp_path / "p.db", tmp_path / "c.db"
    with Producer(p_path, RESERVATION) as p, Consumer(c_path, RESERVATION) as c:
        _ledger(p, c)
    before = digest(p_path), digest(c_path)
    files = listing(tmp_path)
    snap = snapshot(p_path, c_path)
    assert (digest(p_path), digest(c_path)) == before
    # At most the WAL side files of the two databases may appear; nothing else.
    assert set(listing(tmp_path)) - set(files) <= {"p.db-wal", "p.db-shm", "c.db-wal", "c.db-shm"}
    assert snap["producer"]["flows"] == {"A": {"state": "confirmed", "seq": 2, "amount": 3}}
    assert snap["consumer"]["projections"] == {"A": {"state": "reserved", "last_seq": 1, "held": 3}}


def test_snapshot_while_the_files_are_open_changes_no_byte(producer: Producer, consumer: Consumer) -> None:
    _ledger(producer, consumer)
    p_path, c_path = Path(producer.location), Path(consumer.location)
    before = [digest(p) for p in (p_path, c_path, Path(f"{p_path}-wal"), Path(f"{c_path}-wal"))]
    snap = snapshot(p_path, c_path)
    after = [digest(p) for p in (p_path, c_path, Path(f"{p_path}-wal"), Path(f"{c_path}-wal"))]
    assert after == before
    assert snap["producer"]["outbox"]["A"][0]["accepted"] is True
    assert snap["consumer"]["effects"]["A"] == [{"event_id": "A1", "flow_id": "A", "seq": 1, "kind": "reserved"}]
    # The writers are unaffected.
    assert producer.advance("A3", "A", expected_seq=2, kind="released", payload={"amount": 3}).status == "committed"


_NEVER_CLOSED: list[object] = []


def test_snapshot_after_a_writer_exited_without_closing_changes_no_byte(tmp_path: Path) -> None:
    # Regression: snapshot once opened read-write, and as the last connection
    # its close checkpointed the crashed writer's WAL into the main file.
    p_path, c_path = tmp_path / "p.db", tmp_path / "c.db"

    def work() -> str:
        # Exit the way a crash does: committed, connections never closed.  The
        # objects are kept referenced: on Python 3.10 a collected connection
        # closes itself and would checkpoint the WAL away.
        p = Producer(p_path, RESERVATION)
        c = Consumer(c_path, RESERVATION)
        _ledger(p, c)
        _NEVER_CLOSED.append((p, c))
        return "done"

    assert in_forked_child(work) == (0, "done")
    assert Path(f"{p_path}-wal").stat().st_size > 0
    before = digest(p_path), digest(c_path)
    files = listing(tmp_path)
    snap = snapshot(p_path, c_path)
    assert snap["producer"]["flows"]["A"]["seq"] == 2
    assert (digest(p_path), digest(c_path)) == before
    assert listing(tmp_path) == files


# -- bad constructor arguments ----------------------------------------------------------


@pytest.mark.parametrize("cls", [Producer, Consumer])
def test_protocol_must_be_a_protocol(tmp_path: Path, cls: Callable[..., Any]) -> None:
    path = tmp_path / "x.db"
    for bad in (object(), None, "reservation", RESERVATION.name):
        with pytest.raises(TypeError, match="Protocol"):
            cls(path, bad).close()
    assert not path.exists()


@pytest.mark.parametrize("cls", [Producer, Consumer])
@pytest.mark.parametrize("timeout", [-1, -0.001, True, "5", None])
def test_busy_timeout_must_be_a_non_negative_number(tmp_path: Path, cls: Callable[..., Any], timeout: Any) -> None:
    path = tmp_path / "x.db"
    with pytest.raises(ValueError, match="busy_timeout"):
        cls(path, RESERVATION, busy_timeout=timeout).close()
    assert not path.exists()


@pytest.mark.parametrize("timeout", [math.nan, math.inf, 1e7], ids=["nan", "inf", "1e7"])
def test_busy_timeout_that_sqlite_cannot_honour_is_refused(tmp_path: Path, timeout: float) -> None:
    # Regression: these were accepted and silently became PRAGMA busy_timeout 0.
    path = tmp_path / "x.db"
    try:
        p = Producer(path, RESERVATION, busy_timeout=timeout)
    except ValueError:
        return
    try:
        effective = p._store._db.conn.execute("PRAGMA busy_timeout").fetchone()[0]
    finally:
        p.close()
    pytest.fail(f"busy_timeout={timeout!r} accepted; SQLite busy_timeout is {effective} ms")


@pytest.mark.parametrize("cls", [Producer, Consumer])
@pytest.mark.parametrize("bad_path", [":memory:", "", "file:x.db", "file:x.db?mode=memory"])
def test_path_must_name_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cls: Callable[..., Any], bad_path: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="path"):
        cls(bad_path, RESERVATION).close()
    assert listing(tmp_path) == []


@pytest.mark.parametrize(
    "schemas", [{3}, set(), {1, 3}, {0}, "1", 1, [None]], ids=["3", "empty", "1-and-3", "0", "str", "int", "none"]
)
def test_consumer_schemas_must_be_a_non_empty_subset(tmp_path: Path, schemas: Any) -> None:
    path = tmp_path / "c.db"
    with pytest.raises(ValueError, match="schemas"):
        Consumer(path, RESERVATION, schemas=schemas).close()
    assert not path.exists()


@pytest.mark.parametrize("name", ["", "a\nb", "x" * 129, "\x00"])
def test_consumer_name_follows_the_id_rules(tmp_path: Path, name: str) -> None:
    path = tmp_path / "c.db"
    with pytest.raises(ValueError, match="name"):
        Consumer(path, RESERVATION, name=name).close()
    assert not path.exists()


def test_consumer_accepts_a_valid_schema_set(tmp_path: Path) -> None:
    with Consumer(tmp_path / "c.db", RESERVATION, schemas=[1, 2]) as c:
        assert c.schemas == frozenset({1, 2})
    with Consumer(tmp_path / "c.db", RESERVATION) as c:
        assert c.schemas == frozenset({1})


def test_a_directory_is_not_a_file(tmp_path: Path) -> None:
    with pytest.raises(reliable_flow.ReliableFlowError):
        Producer(tmp_path, RESERVATION).close()
    assert listing(tmp_path) == []
