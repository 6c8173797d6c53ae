"""The PostgreSQL engine beyond the shared contract: opening and refusing a
schema, the two engines delivering to each other, durability settings, a
connection lost at COMMIT, and the locks that replace SQLite's single writer.

Every test runs on the session's private server (``tests/pg_cluster.py``);
each store gets a fresh schema.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pg_cluster import PG_DATABASE, import_psycopg, pg_location

psycopg = import_psycopg()  # skips saying what to install (fails under RELIABLE_FLOW_REQUIRE_POSTGRES)

from reliable_flow import Consumer, Producer, relay
from reliable_flow._envelope import make
from reliable_flow._store.postgres import DEFAULT_SCHEMAS, PgInboxStore, PgOutboxStore
from reliable_flow.errors import CommitOutcomeUnknown, SchemaTooNew, StorageError, WrongFile
from reliable_flow.reservation import RESERVATION

pytestmark = pytest.mark.postgres


def env(event_id: str, flow_id: str = "F", seq: int = 1):
    return make(event_id=event_id, flow_id=flow_id, seq=seq, kind="created", schema=1,
                payload={"id": event_id}, meta=None)


def raw(location: str) -> psycopg.Connection:
    """A plain connection to the location's database (the fragment removed)."""
    return psycopg.connect(location.partition("#")[0], autocommit=True)


def schema_of(location: str) -> str:
    return location.partition("#")[2]


# -- opening and refusing ------------------------------------------------------------------


def test_a_new_location_is_created_with_its_identity_row(pg_cluster) -> None:
    location = pg_location("ident")
    store = PgOutboxStore(location, "orders-v1")
    try:
        assert store.schema == schema_of(location)
        assert store.location.endswith("#" + schema_of(location))
        with raw(location) as conn:
            row = conn.execute(f'SELECT product, kind, version FROM "{store.schema}".rf_identity').fetchone()
        assert row == ("reliable_flow", "producer", 2)
        assert store.latest.protocol_name() == "orders-v1"
    finally:
        store.close()


def test_a_schema_of_the_other_kind_is_refused(pg_cluster) -> None:
    location = pg_location("kind")
    PgOutboxStore(location, "p").close()
    with pytest.raises(WrongFile, match="is a reliable_flow producer store, not a consumer store"):
        PgInboxStore(location, "p")
    inbox_location = pg_location("kind2")
    PgInboxStore(inbox_location, "p").close()
    with pytest.raises(WrongFile, match="is a reliable_flow consumer store, not a producer store"):
        PgOutboxStore(inbox_location, "p")


def test_a_newer_schema_is_refused_before_anything_is_written(pg_cluster) -> None:
    location = pg_location("newer")
    PgOutboxStore(location, "p").close()
    with raw(location) as conn:
        conn.execute(f'UPDATE "{schema_of(location)}".rf_identity SET version = 99')
    with pytest.raises(SchemaTooNew, match="schema version 99; this reliable_flow understands up to 2"):
        PgOutboxStore(location, "p")


def test_another_protocol_or_consumer_name_is_refused(pg_cluster) -> None:
    location = pg_location("proto")
    PgOutboxStore(location, "orders-v1").close()
    with pytest.raises(WrongFile, match="was created for protocol 'orders-v1', not 'other'"):
        PgOutboxStore(location, "other")
    inbox = pg_location("proto_in")
    PgInboxStore(inbox, "orders-v1", name="billing").close()
    with pytest.raises(WrongFile, match="belongs to consumer 'billing', not 'shipping'"):
        PgInboxStore(inbox, "orders-v1", name="shipping")
    with pytest.raises(WrongFile, match="not 'other'"):
        PgInboxStore(inbox, "other")


def test_a_foreign_schema_or_product_is_refused(pg_cluster) -> None:
    location = pg_location("foreign")
    with raw(location) as conn:
        conn.execute(f'CREATE SCHEMA "{schema_of(location)}"')
        conn.execute(f'CREATE TABLE "{schema_of(location)}".customers(id int)')
    with pytest.raises(WrongFile, match="not a reliable_flow producer store"):
        PgOutboxStore(location, "p")
    other = pg_location("product")
    PgOutboxStore(other, "p").close()
    with raw(other) as conn:
        conn.execute(f"UPDATE \"{schema_of(other)}\".rf_identity SET product = 'someone-else'")
    with pytest.raises(WrongFile, match="belongs to 'someone-else'"):
        PgOutboxStore(other, "p")


def test_two_processes_creating_one_fresh_location_at_once_both_succeed(pg_cluster) -> None:
    location = pg_location("race_create")
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def opener() -> None:
        try:
            start.wait(10)
            PgOutboxStore(location, "p").close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    with raw(location) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{schema_of(location)}".rf_identity').fetchone() == (1,)


def test_the_default_schemas_and_a_connection_factory(pg_cluster) -> None:
    database = pg_cluster.dsn(PG_DATABASE)
    with raw(database) as conn:
        for schema in DEFAULT_SCHEMAS.values():
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    store = PgOutboxStore(database, "p")
    try:
        assert store.schema == "reliable_flow_producer"
    finally:
        store.close()
    inbox = PgInboxStore(lambda: psycopg.connect(database), "p")
    try:
        assert inbox.schema == "reliable_flow_consumer"
        assert inbox.location.startswith("postgresql://") and inbox.location.endswith("#reliable_flow_consumer")
        assert inbox.latest.meta()["name"] == "default"
    finally:
        inbox.close()


# -- the two engines deliver to each other -----------------------------------------------


def test_a_producer_on_postgres_delivers_to_a_consumer_on_sqlite(pg_cluster, tmp_path: Path) -> None:
    with Producer(pg_location("p2s"), RESERVATION) as producer, \
            Consumer(tmp_path / "consumer.db", RESERVATION) as consumer:
        assert producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "committed"
        assert producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "existing"
        assert producer.advance("A2", "A", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "stale"
        assert relay(producer, consumer).status == "accepted"
        assert relay(producer, consumer).status == "idle"
        assert producer.outbox("A")[0].accepted is True
        assert consumer.apply_next("A").status == "applied"
        assert consumer.projection("A") == {"state": "reserved", "last_seq": 1, "held": 3}


def test_a_producer_on_sqlite_delivers_to_a_consumer_on_postgres(pg_cluster, tmp_path: Path) -> None:
    with Producer(tmp_path / "producer.db", RESERVATION) as producer, \
            Consumer(pg_location("s2p"), RESERVATION) as consumer:
        assert producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "committed"
        assert producer.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"amount": 3}).status == "committed"
        assert relay(producer, consumer).status == "accepted"
        assert relay(producer, consumer).status == "accepted"
        assert [e.event_id for e in consumer.inbox("A")] == ["A1", "A2"]
        assert consumer.apply_next("A").status == "applied"
        assert consumer.apply_next("A").status == "applied"
        assert consumer.apply_next("A").status == "idle"
        assert consumer.projection("A")["last_seq"] == 2


# -- durability -------------------------------------------------------------------------


def setting(unit, name: str) -> str:
    return str(unit.user_execute("SELECT current_setting(%s)", (name,))[0][0])


def test_an_undurable_unit_skips_the_wait_for_the_disk_for_itself_only(pg_cluster) -> None:
    store = PgInboxStore(pg_location("durable"), "p")
    try:
        with store.write() as unit:
            assert setting(unit, "synchronous_commit") == "on"
        with store.write(durable=False) as unit:
            assert setting(unit, "synchronous_commit") == "off"
        with store.write() as unit:
            assert setting(unit, "synchronous_commit") == "on"
    finally:
        store.close()


def test_a_session_default_of_synchronous_commit_off_is_raised_to_on(pg_cluster) -> None:
    database = pg_cluster.dsn(PG_DATABASE)
    location = pg_location("sync_off")
    factory = lambda: psycopg.connect(database, options="-c synchronous_commit=off")
    store = PgInboxStore(factory, "p", schema=schema_of(location))
    try:
        with store.write() as unit:
            assert setting(unit, "synchronous_commit") == "on"
    finally:
        store.close()


def test_a_server_without_fsync_is_refused(pg_cluster) -> None:
    """fsync=off can lose committed transactions in a crash: the store refuses to open."""
    location = pg_location("fsync")
    with raw(location) as conn:
        conn.execute("ALTER SYSTEM SET fsync = off")
        conn.execute("SELECT pg_reload_conf()")
    try:
        with raw(location) as conn:  # the reload reaches new sessions at once
            assert conn.execute("SHOW fsync").fetchone() == ("off",)
        with pytest.raises(StorageError, match="fsync=off"):
            PgOutboxStore(location, "p")
    finally:
        with raw(location) as conn:
            conn.execute("ALTER SYSTEM RESET fsync")
            conn.execute("SELECT pg_reload_conf()")
    with raw(location) as conn:
        assert conn.execute("SHOW fsync").fetchone() == ("on",)
    PgOutboxStore(location, "p").close()


def terminate(store_pid: int, location: str) -> None:
    with raw(location) as conn:
        assert conn.execute("SELECT pg_terminate_backend(%s)", (store_pid,)).fetchone() == (True,)


def test_a_connection_lost_at_commit_raises_commit_outcome_unknown(pg_cluster) -> None:
    location = pg_location("lost_commit")
    store = PgInboxStore(location, "p")
    try:
        with pytest.raises(CommitOutcomeUnknown) as raised, store.write() as unit:
            assert unit.insert_new(env("E1"))
            terminate(int(unit.user_execute("SELECT pg_backend_pid()")[0][0]), location)
        assert isinstance(raised.value.__cause__, psycopg.Error)
        # The next call opens a new connection; the write was lost (terminated before COMMIT).
        assert store.latest.inbox_row("E1") is None
        with store.write() as unit:
            assert unit.insert_new(env("E1"))
        assert store.latest.inbox_row("E1").body == env("E1").body
    finally:
        store.close()


def test_a_connection_lost_before_commit_is_a_storage_error(pg_cluster) -> None:
    location = pg_location("lost_stmt")
    database = location.partition("#")[0]
    factory = lambda: psycopg.connect(database, application_name="rf-lost-stmt")
    store = PgOutboxStore(factory, "p", schema=schema_of(location))
    try:
        with store.write() as unit:
            unit.append_event(env("E0"))
        with raw(location) as conn:
            [(pid,)] = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'rf-lost-stmt'"
            ).fetchall()
        terminate(pid, location)
        with pytest.raises(StorageError) as raised, store.write() as unit:
            unit.append_event(env("E1", seq=2))
        assert not isinstance(raised.value, CommitOutcomeUnknown)
        assert isinstance(raised.value.__cause__, psycopg.Error)
        assert [e.event_id for e in store.latest.outbox()] == ["E0"]
    finally:
        store.close()


# -- locks instead of a single writer --------------------------------------------------------


def test_registering_a_consumer_waits_for_an_append_in_flight(pg_cluster) -> None:
    """The hazard: without the registry lock, an event committed while a name is
    being registered is pending for nobody new, and never delivered to it."""
    location = pg_location("register_race")
    store = PgOutboxStore(location, "p")
    other = PgOutboxStore(location, "p")
    registered = threading.Event()
    errors: list[BaseException] = []

    def register() -> None:
        try:
            mine = PgOutboxStore(location, "p")
            try:
                with mine.write() as unit:
                    unit.register_consumer("late", 1.0, False)
            finally:
                mine.close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            registered.set()

    try:
        with store.write() as unit:
            unit.append_event(env("E1"))
            thread = threading.Thread(target=register)
            thread.start()
            assert not registered.wait(0.5), "the registration did not wait for the append in flight"
        thread.join(30)
        assert errors == []
        [(pos, _)] = other.latest.next_due("late", 1e12, 10)
        assert pos == other.latest.find_event("E1").pos
    finally:
        store.close()
        other.close()


def test_two_relays_never_claim_the_same_delivery(pg_cluster) -> None:
    location = pg_location("claims")
    first = PgOutboxStore(location, "p")
    second = PgOutboxStore(location, "p")
    try:
        with first.write() as unit:
            unit.register_consumer("c", 0.0, False)
            unit.bind_consumer("c", "uid-c")
            for i in range(1, 5):
                unit.append_event(env(f"E{i}", seq=i))
        with first.write(durable=False) as a:
            mine = [pos for pos, _ in a.next_due("c", 10.0, 2)]
            a.claim("c", mine, 100.0, "relay-a", 10.0)
            with second.write(durable=False) as b:
                theirs = [pos for pos, _ in b.next_due("c", 10.0, 10)]
                b.claim("c", theirs, 100.0, "relay-b", 10.0)
        assert len(mine) == 2 and len(theirs) == 2
        assert not set(mine) & set(theirs)
        assert first.latest.next_due("c", 50.0, 10) == []
    finally:
        first.close()
        second.close()


def test_a_retry_racing_its_original_advance_answers_existing(pg_cluster) -> None:
    """The retry's find_event waits on the event id the original holds, then
    finds it: ``existing``, not ``stale`` (its flow moved on meanwhile)."""
    location = pg_location("advance_race")
    answers: list[object] = []

    def retry() -> None:
        try:
            with Producer(location, RESERVATION) as second:
                answers.append(
                    second.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 1}).status)
        except BaseException as exc:  # noqa: BLE001 - reported below
            answers.append(exc)

    with Producer(location, RESERVATION) as first:
        with first.batch() as batch:
            assert batch.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 1}).status == "committed"
            thread = threading.Thread(target=retry)
            thread.start()
            thread.join(0.5)
            assert thread.is_alive(), f"the retry did not wait for the original's transaction: {answers}"
        thread.join(30)
    assert answers == ["existing"]


# -- the application's own SQL ------------------------------------------------------------


@pytest.mark.parametrize("text", [
    "COMMIT", "  /* a /* nested */ comment */ -- and a line\n commit", "ROLLBACK", "begin", "SAVEPOINT x",
    "RELEASE x", "END", "ABORT", "PREPARE TRANSACTION 'x'", "SET synchronous_commit = off", "(COMMIT)",
])
def test_user_sql_may_not_control_the_transaction(pg_cluster, text: str) -> None:
    store = PgInboxStore(pg_location("user_tx"), "p")
    try:
        with store.write() as unit:
            with pytest.raises(ValueError, match="transaction control"):
                unit.user_execute(text)
            unit.insert_new(env("E1"))
        assert store.latest.inbox_row("E1") is not None
    finally:
        store.close()


def test_user_sql_is_one_statement(pg_cluster) -> None:
    store = PgInboxStore(pg_location("user_one"), "p")
    try:
        with store.write() as unit:
            unit.user_execute("CREATE TABLE note(text TEXT)")
            with pytest.raises(psycopg.errors.SyntaxError), unit.step():
                unit.user_execute("INSERT INTO note VALUES ('a'); COMMIT")
            unit.user_execute("INSERT INTO note VALUES (%s)", ("b%",))
            assert unit.user_execute("SELECT text FROM note") == [("b%",)]
    finally:
        store.close()


# -- fork ----------------------------------------------------------------------------------


def test_a_child_reopens_after_fork_and_leaves_the_parents_connection_alone(pg_cluster) -> None:
    import os

    store = PgOutboxStore(pg_location("fork"), "p")
    try:
        with store.write() as unit:
            unit.append_event(env("E1"))
        pid = os.fork()
        if pid == 0:  # the child: reopen, write, exit without running the parent's cleanup
            code = 1
            try:
                store.reopen()
                with store.write() as unit:
                    unit.append_event(env("E2", seq=2))
                store.close()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The parent's connection still works after the child dropped its copy.
        assert [e.event_id for e in store.latest.outbox()] == ["E1", "E2"]
    finally:
        store.close()
