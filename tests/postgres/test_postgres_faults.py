"""PostgreSQL-only faults: the server killed and restarted under a running
workload, and a backend terminated while its COMMIT is in flight.

These tests run on a private server of this module (``PgCluster``), not the
session's, because they kill it and change its settings.

* The server is SIGKILLed (the postmaster; its backends follow) and
  restarted, three times, while a child process takes flows through
  advance -> relay -> apply (``children/pg_outage.py``).  Every call during
  the outage must raise a ``StorageError`` subclass, never answer a wrong
  status; afterwards nothing the child was told is lost or doubled.
* A COMMIT is held in flight (``synchronous_standby_names`` names a standby
  that never comes, so a durable COMMIT waits after it is written locally)
  and its backend is terminated there: the call raises
  ``CommitOutcomeUnknown``, and the same call made again answers that it
  was done (existing / duplicate / idle with one effect).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pg_cluster import MISSING_BINARIES, PgCluster, find_bin_dir, import_psycopg, pg_required

psycopg = import_psycopg()  # skips saying what to install (fails under RELIABLE_FLOW_REQUIRE_POSTGRES)

from engine_reads import effect_counts
from reliable_flow import Consumer, Producer, relay
from reliable_flow.errors import CommitOutcomeUnknown, StorageError
from reliable_flow.reservation import RESERVATION
from support import CHILDREN, child_env, relay_log

pytestmark = pytest.mark.postgres

OUTAGE = CHILDREN / "pg_outage.py"
FLOWS = 40
OUTAGES = 3
DB = "rf_faults"


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    """A private server for this module: these tests kill it and change its settings."""
    if find_bin_dir() is None:
        if pg_required():
            pytest.fail(MISSING_BINARIES, pytrace=False)
        pytest.skip(MISSING_BINARIES)
    server = PgCluster()
    try:
        server.start()
        server.create_database(DB)
        yield server
    finally:
        server.destroy()


_names = iter(range(1, 10**6))


def location(server: PgCluster, label: str, **params: str) -> str:
    """A fresh schema in the module's database; ``params`` added to the connection string."""
    url, _, schema = server.dsn(DB, f"f{next(_names)}_{label}").partition("#")
    extra = "".join(f"&{k}={v}" for k, v in params.items())
    return f"{url}{extra}#{schema}"


def admin(server: PgCluster) -> Any:
    return psycopg.connect(server.dsn("postgres"), autocommit=True)


# -- the server killed and restarted mid-run -------------------------------------------------


def read_journal(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [line.split(" ")[:-1] for line in lines if line.endswith(" .")]


def wait_for(predicate: Callable[[], bool], proc: subprocess.Popen[str], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"the child ended while waiting for {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_the_server_killed_and_restarted_mid_run_loses_nothing_acknowledged(
    cluster: PgCluster, tmp_path: Path
) -> None:
    producer, consumer = location(cluster, "outage_p"), location(cluster, "outage_c")
    Producer(producer, RESERVATION).close()
    Consumer(consumer, RESERVATION).close()
    journal = tmp_path / "journal.txt"
    acknowledged = lambda: sum(1 for f in read_journal(journal) if f[0] != "error")
    errors = lambda: sum(1 for f in read_journal(journal) if f[0] == "error")
    with subprocess.Popen(
        [sys.executable, str(OUTAGE), producer, consumer, str(journal), str(FLOWS)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(), cwd=tmp_path,
    ) as proc:
        try:
            for n in range(OUTAGES):
                done = acknowledged()
                wait_for(lambda: acknowledged() >= done + 15, proc, f"progress before outage {n}")  # noqa: B023
                cluster.kill()
                seen = errors()
                wait_for(lambda: errors() > seen, proc, f"the child to notice outage {n}")  # noqa: B023
                cluster.start()
            out, err = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, err
    assert out.splitlines() == ["ready", "done"], out

    lines = read_journal(journal)
    failures = Counter(f"{f[1]} {f[2]}" for f in lines if f[0] == "error")
    print(f"\nfailed calls during {OUTAGES} outages: {dict(failures)}")
    assert sum(failures.values()) >= OUTAGES, failures
    # Only library errors (the child dies on anything that is not a StorageError).
    assert {name.split(" ")[1] for name in failures} <= {
        "StorageError", "CommitOutcomeUnknown", "DatabaseBusy", "TransactionConflict"}, failures
    answers = Counter((f[0], f[1]) for f in lines if f[0] != "error")
    committed = Counter(f[2] for f in lines if f[:2] == ["advance", "committed"])
    applied = Counter(f[2] for f in lines if f[:2] == ["apply", "applied"])
    stored = Counter(f[2] for f in lines if f[:2] == ["relay", "accepted"])
    assert max(committed.values()) == 1 and max(applied.values()) == 1 and max(stored.values()) == 1, answers

    every = {f"F{i}-{s}" for i in range(FLOWS) for s in (1, 2, 3)}
    with Producer(producer, RESERVATION) as p, Consumer(consumer, RESERVATION) as c:
        assert set(committed) <= every and {e.event_id for e in p.outbox()} == every
        assert all(e.accepted for e in p.outbox())
        assert set(applied) <= every
        for i in range(FLOWS):
            flow = f"F{i}"
            assert p.flow(flow) == {"state": "released", "seq": 3, "amount": i + 1}
            assert c.projection(flow) == {"state": "released", "last_seq": 3, "held": 0}
            assert [e.event_id for e in c.applied(flow)] == [f"{flow}-1", f"{flow}-2", f"{flow}-3"]
        assert relay(p, c).status == "idle"
    assert effect_counts(consumer) == Counter(dict.fromkeys(every, 1))


def test_a_read_on_a_lost_connection_is_a_storage_error_and_the_next_call_reconnects(cluster: PgCluster) -> None:
    """Regression: a read outside a unit of work (``producer.flow``, a relay's
    look for the next event) used to raise the driver's OperationalError, and
    leave the store on a closed connection."""
    where = location(cluster, "lost_read", application_name="rf-lost-read")
    with Producer(where, RESERVATION) as p:
        assert p.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "committed"
        with admin(cluster) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'rf-lost-read'")
        with pytest.raises(StorageError) as raised:
            p.flow("A")
        assert isinstance(raised.value.__cause__, psycopg.OperationalError)
        assert p.flow("A") == {"state": "reserved", "seq": 1, "amount": 3}


def test_while_the_server_is_down_every_call_fails_cleanly_and_then_works_again(cluster: PgCluster) -> None:
    """Regression: a reconnect that failed (the server still down) used to
    leave the store "closed; call reopen()" for ever."""
    producer, consumer = location(cluster, "down_p"), location(cluster, "down_c")
    with Producer(producer, RESERVATION) as p, Consumer(consumer, RESERVATION) as c:
        assert p.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "committed"
        cluster.kill()
        try:
            for call in (
                lambda: p.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"amount": 3}),
                lambda: p.flow("A"), lambda: relay(p, c), lambda: c.apply_next("A"), lambda: p.outbox(),
                lambda: p.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"amount": 3}),
            ):
                with pytest.raises(StorageError):
                    call()
        finally:
            cluster.start()
        assert p.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"amount": 3}).status == "committed"
        assert relay_log(p, c) == ["A1 accepted", "A2 accepted"]
        assert c.drain("A").applied == 2


# -- a backend terminated while its COMMIT is in flight --------------------------------------


class HeldCommits:
    """While active, every durable COMMIT on the server waits for a
    synchronous standby that does not exist: written and flushed locally,
    not yet acknowledged to the client."""

    def __init__(self, server: PgCluster) -> None:
        self.server = server

    def __enter__(self) -> HeldCommits:  # noqa: PYI034 - a final test helper
        self._set("ALTER SYSTEM SET synchronous_standby_names = 'rf_nobody'")
        return self

    def __exit__(self, *exc: object) -> None:
        self._set("ALTER SYSTEM RESET synchronous_standby_names")

    def _set(self, statement: str) -> None:
        with admin(self.server) as conn:
            conn.execute(statement)
            conn.execute("SELECT pg_reload_conf()")
            # A reload reaches every backend before its next command; wait until ours sees it.
            want = "" if "RESET" in statement else "rf_nobody"
            deadline = time.monotonic() + 10
            while conn.execute("SELECT current_setting('synchronous_standby_names')").fetchone() != (want,):
                assert time.monotonic() < deadline, "the reload never took effect"
                time.sleep(0.01)


def terminate_at_commit(server: PgCluster, app: str, call: Callable[[], Any]) -> BaseException | None:
    """Run ``call`` in a thread (it opens its own objects) with COMMITs held;
    terminate the backend of application ``app`` once it waits in its
    COMMIT; what the call raised (None if it returned)."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            raised.append(None)
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            raised.append(exc)

    with HeldCommits(server), admin(server) as conn:
        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 30
        while True:
            row = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND wait_event = 'SyncRep'", (app,)
            ).fetchone()
            if row is not None:
                break
            assert thread.is_alive(), f"the call ended before its COMMIT waited: {raised}"
            assert time.monotonic() < deadline, "the COMMIT never waited for the standby"
            time.sleep(0.01)
        assert conn.execute("SELECT pg_terminate_backend(%s)", (row[0],)).fetchone() == (True,)
        thread.join(30)
    assert not thread.is_alive()
    return raised[0]


def test_an_advance_whose_commit_was_cut_off_answers_existing_when_retried(cluster: PgCluster) -> None:
    where = location(cluster, "commit_adv", application_name="rf-commit-adv")
    Producer(where, RESERVATION).close()

    def advance() -> None:
        with Producer(where, RESERVATION) as p:
            p.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})

    raised = terminate_at_commit(cluster, "rf-commit-adv", advance)
    assert isinstance(raised, CommitOutcomeUnknown), raised
    assert isinstance(raised.__cause__, psycopg.Error)
    with Producer(where, RESERVATION) as p:
        again = p.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
        assert (again.status, again.seq) == ("existing", 1)  # it was committed (locally durable)
        assert [e.event_id for e in p.outbox()] == ["A1"]
        assert p.flow("A") == {"state": "reserved", "seq": 1, "amount": 3}


def test_a_batch_whose_commit_was_cut_off_answers_existing_for_each_advance(cluster: PgCluster) -> None:
    where = location(cluster, "commit_batch", application_name="rf-commit-batch")
    Producer(where, RESERVATION).close()

    def batch() -> None:
        with Producer(where, RESERVATION) as p, p.batch() as b:
            b.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
            b.advance("B1", "B", expected_seq=0, kind="reserved", payload={"amount": 4})

    assert isinstance(terminate_at_commit(cluster, "rf-commit-batch", batch), CommitOutcomeUnknown)
    with Producer(where, RESERVATION) as p, p.batch() as b:
        first = b.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
        second = b.advance("B1", "B", expected_seq=0, kind="reserved", payload={"amount": 4})
    assert (first.status, second.status) == ("existing", "existing")


def test_a_receive_and_an_apply_whose_commit_was_cut_off_answer_duplicate_and_idle(cluster: PgCluster) -> None:
    where = location(cluster, "commit_recv", application_name="rf-commit-recv")
    Consumer(where, RESERVATION).close()
    body = {"event_id": "A1", "flow_id": "A", "seq": 1, "kind": "reserved", "schema": 1, "payload": {"amount": 3}}

    def receive() -> None:
        with Consumer(where, RESERVATION) as c:
            c.receive(body)

    def apply() -> None:
        with Consumer(where, RESERVATION) as c:
            c.apply_next("A")

    assert isinstance(terminate_at_commit(cluster, "rf-commit-recv", receive), CommitOutcomeUnknown)
    with Consumer(where, RESERVATION) as c:
        assert c.receive(body).status == "duplicate"
    assert isinstance(terminate_at_commit(cluster, "rf-commit-recv", apply), CommitOutcomeUnknown)
    with Consumer(where, RESERVATION) as c:
        assert c.apply_next("A").status == "idle"
        assert [e.event_id for e in c.applied("A")] == ["A1"]
        assert c.projection("A") == {"state": "reserved", "last_seq": 1, "held": 3}


def test_a_relay_whose_receive_commit_was_cut_off_is_answered_duplicate_next_time(cluster: PgCluster) -> None:
    """The producer is on its own connection (another application name): only
    the consumer's receive COMMIT is cut off; the relay records the failure
    (a non-durable write, which does not wait for the standby) and the next
    relay's re-send is a duplicate, marked accepted."""
    producer = location(cluster, "commit_relay_p")
    consumer = location(cluster, "commit_relay_c", application_name="rf-commit-relay")
    with Producer(producer, RESERVATION) as p, Consumer(consumer, RESERVATION) as c:
        assert p.advance("B1", "B", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "committed"
        assert relay(p, c).status == "accepted"  # registers and binds the consumer (durable producer writes)
        assert p.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}).status == "committed"

    def send() -> None:
        with Producer(producer, RESERVATION) as p, Consumer(consumer, RESERVATION) as c:
            relay(p, c)

    assert isinstance(terminate_at_commit(cluster, "rf-commit-relay", send), CommitOutcomeUnknown)
    with Producer(producer, RESERVATION) as p, Consumer(consumer, RESERVATION) as c:
        record = p.outbox("A")[0].deliveries["default"]
        assert (record.state, record.attempts) == ("pending", 1) and "CommitOutcomeUnknown" in (record.last_error or "")
        assert [(r.event_id, str(r.status)) for r in [relay(p, c)]] == [("A1", "duplicate")]
        assert p.outbox("A")[0].accepted is True
        assert [e.event_id for e in c.inbox("A")] == ["A1"]

