"""Statements, round trips and CPU per event, per path and engine, library beside raw.

    python benchmarks/paths.py                  # SQLite and PostgreSQL, a few minutes
    python benchmarks/paths.py --quick          # smoke run, seconds (figures not to quote)
    python benchmarks/paths.py --engine sqlite  # without a PostgreSQL server
    python benchmarks/paths.py --write-results  # also write benchmarks/RESULTS-paths.md

Four paths, each on SQLite (two files) and on PostgreSQL (two schemas of a
private server started through ``tests/pg_cluster.py``, as ``postgres.py``
does):

* ``advance``: ``producer.advance`` alone (one consumer bound, so every
  advance also writes its delivery row);
* ``two-step``: unbatched ``advance`` -> ``relay`` -> ``apply_next``;
* ``receive-and-apply``: unbatched ``advance`` -> ``relay`` to
  ``consumer.applying()``;
* ``batched``: ``producer.batch()`` of 100 advances, ``relay_batch(limit=100)``,
  ``process_all(batch_size=100)``.

Beside each library side runs a hand-written reference doing the same
durable commits with the same row bytes: on SQLite the suite's own (the
floor's one-commit ``advance`` of ``floor.py``; the minimal raw 4-commit and
raw 2-durable-commit pipelines of ``raw.py``, unbatched and batched); on
PostgreSQL the minimal raw psycopg pipelines of this file (:class:`RawPg`:
``raw.py``'s schema in PostgreSQL, every transaction sent as ONE pipeline,
so one round trip per transaction, the same durable and non-durable commits
as the library's path).

Two measurements per side:

* **counts** (an untimed audit run): every SQL statement executed, taken
  from SQLite's trace callback on each of the side's ``sqlite3``
  connections and from libpq's protocol trace (``pgconn.trace``) on each of
  its ``psycopg`` connections, which also gives the **round trips**: the
  number of times the client sent one or more messages and then read the
  server's answer (a run of frontend messages followed by a backend
  message).  The method is checked on known cases before the run.  The
  connections are found by walking the objects of each side (the library's
  are private: nothing here depends on their names);
* **time** (interleaved rounds, no tracing): wall and this process's CPU
  time per event (both stores in-process; for PostgreSQL the server's CPU is
  not in it, and is shown apart: the on-CPU time of the side's backends from
  ``/proc/<pid>/schedstat``).

Every run is checked after the clock: each event committed, accepted and
applied exactly once (store contents read directly), every projection at
its flow's last event.  See benchmarks/README.md ("Statements, round trips
and CPU per event").
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import random
import re
import shutil
import sqlite3
import sys
import tempfile
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import cases
import raw
from common import Event, Sample, chunks, machine, make_events, median
from floor import create_files
from reliable_flow import Consumer, Producer, relay, relay_batch
from reliable_flow.reservation import RESERVATION
from run import Load, interleave

SQLITE, POSTGRES = "SQLite", "PostgreSQL"
ADVANCE, TWO_STEP, RNA, BATCHED = "advance", "two-step", "receive-and-apply", "batched"
PATHS = (ADVANCE, TWO_STEP, RNA, BATCHED)
PATH_TITLES = {
    ADVANCE: "`advance` alone",
    TWO_STEP: "unbatched two-step (advance; relay; apply_next)",
    RNA: "unbatched receive-and-apply (advance; relay to `consumer.applying()`)",
    BATCHED: "batched (100): `batch()`; `relay_batch`; `process_all`",
}
LIB, FLOOR, RAW4, RAW2, RAWPG = "library", "floor", "raw4", "raw2", "raw psycopg"
WHO_TITLES = {
    LIB: "library",
    FLOOR: "floor (library's schema, one commit)",
    RAW4: "minimal raw 4-commit",
    RAW2: "raw 2-durable-commit",
    RAWPG: "raw psycopg (same commits, 1 round trip each)",
}
GROUPS = ("advance", "unbatched", "batched")
BATCH = 100
RESULTS = os.path.join(HERE, "RESULTS-paths.md")
TX_WORDS = {"BEGIN", "START", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE"}

# A side: (engine, path, who).  The raw 4/2-commit pipelines of SQLite serve
# as the reference of both unbatched paths; they are keyed under TWO_STEP.
Key = tuple[str, str, str]

#: path -> the references its library side is compared with, per engine (the first one is the headline)
REFERENCES: dict[tuple[str, str], tuple[Key, ...]] = {
    (SQLITE, ADVANCE): ((SQLITE, ADVANCE, FLOOR),),
    (SQLITE, TWO_STEP): ((SQLITE, TWO_STEP, RAW4), (SQLITE, TWO_STEP, RAW2)),
    (SQLITE, RNA): ((SQLITE, TWO_STEP, RAW4), (SQLITE, TWO_STEP, RAW2)),
    (SQLITE, BATCHED): ((SQLITE, BATCHED, RAW4), (SQLITE, BATCHED, RAW2)),
    (POSTGRES, ADVANCE): ((POSTGRES, ADVANCE, RAWPG),),
    (POSTGRES, TWO_STEP): ((POSTGRES, TWO_STEP, RAWPG),),
    (POSTGRES, RNA): ((POSTGRES, RNA, RAWPG),),
    (POSTGRES, BATCHED): ((POSTGRES, BATCHED, RAWPG),),
}


@dataclass(frozen=True)
class Sizes:
    single: int = 90  # advance alone: events per side per round
    e2e: int = 90  # unbatched: events per side per round
    batched: int = 800  # batched: events per side per round (chunks of 100)
    block: int = 10  # unbatched: events per interleaving block
    batched_block: int = 2  # batched: batches per interleaving block
    audit_single: int = 60  # the counting run (whole flows: multiples of 3)
    audit_batched: int = 600

    @classmethod
    def quick(cls) -> Sizes:
        return cls(single=15, e2e=15, batched=200, block=5, batched_block=1, audit_single=15, audit_batched=200)


def group_of(path: str) -> str:
    return {ADVANCE: "advance", TWO_STEP: "unbatched", RNA: "unbatched", BATCHED: "batched"}[path]


def sides_of(group: str, engines: Sequence[str]) -> list[Key]:
    out: list[Key] = []
    for engine in engines:
        if group == "advance":
            out += [(engine, ADVANCE, LIB), (engine, ADVANCE, FLOOR if engine == SQLITE else RAWPG)]
        elif group == "unbatched":
            out += [(engine, TWO_STEP, LIB), (engine, RNA, LIB)]
            if engine == SQLITE:
                out += [(engine, TWO_STEP, RAW4), (engine, TWO_STEP, RAW2)]
            else:
                out += [(engine, TWO_STEP, RAWPG), (engine, RNA, RAWPG)]
        else:
            out += [(engine, BATCHED, LIB)]
            out += [(engine, BATCHED, RAW4), (engine, BATCHED, RAW2)] if engine == SQLITE else [
                (engine, BATCHED, RAWPG)]
    return out


# -- finding a side's connections ----------------------------------------------------------------


def _connection_types() -> tuple[type, ...]:
    kinds: tuple[type, ...] = (sqlite3.Connection,)
    try:
        import psycopg

        kinds += (psycopg.Connection,)
    except ImportError:
        pass
    return kinds


_LEAVES = (str, bytes, bytearray, int, float, bool, complex, type(None), type, types.ModuleType,
           types.FunctionType, types.BuiltinFunctionType, types.CodeType, range)


def find_connections(*roots: Any, limit: int = 50_000) -> list[Any]:
    """Every sqlite3 / psycopg connection reachable from ``roots`` through
    attributes, slots, containers and bound methods (depth <= 8).  The
    library's connections are private: found by type, not by name."""
    kinds = _connection_types()
    seen: set[int] = set()
    found: list[Any] = []
    stack = [(r, 0) for r in roots]
    while stack and len(seen) < limit:
        obj, depth = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, kinds):
            found.append(obj)
            continue
        if depth >= 8 or isinstance(obj, _LEAVES):
            continue
        children: list[Any] = []
        if isinstance(obj, dict):
            children = list(obj.values())[:500]
        elif isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
            children = list(obj)[:500]
        elif isinstance(obj, types.MethodType):
            children = [obj.__self__]
        elif isinstance(obj, functools.partial):
            children = [obj.func, *obj.args, *obj.keywords.values()]
        else:
            attrs = getattr(obj, "__dict__", None)
            if isinstance(attrs, dict):
                children += list(attrs.values())
            for cls in type(obj).__mro__:
                slots = cls.__dict__.get("__slots__", ())
                for name in (slots,) if isinstance(slots, str) else slots:
                    if name not in ("__dict__", "__weakref__"):
                        try:
                            children.append(getattr(obj, name))
                        except AttributeError:
                            pass
        stack.extend((c, depth + 1) for c in children)
    return found


# -- counting statements ---------------------------------------------------------------------------

_LITERAL = re.compile(
    r"'(?:[^']|'')*'|\b[xX]'[0-9A-Fa-f]*'|(?<![\w.$])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?\b"
)
_LIST = re.compile(r"\?(?:\s*,\s*\?)+")
_ROWS = re.compile(r"(\([^()]*\))(?:\s*,\s*\1)+")


def normalize(sql: str) -> str:
    """One statement's shape: literals as ?, lists and repeated value rows folded."""
    s = " ".join(_LITERAL.sub("?", sql).split())
    s = _LIST.sub("?, ...", s)
    return _ROWS.sub(r"\1, ...", s).rstrip(";").strip()


def kind_of(shape: str) -> str:
    if shape.startswith("--"):
        return "trigger"
    words = shape.split(None, 2)
    first = words[0].upper() if words else ""
    if first == "ROLLBACK" and len(words) > 1 and words[1].upper() == "TO":
        return "ROLLBACK TO"
    if first == "START":
        return "BEGIN"
    if first == "END":
        return "COMMIT"
    return first


@dataclass
class Counts:
    """What a side executed in the counting run."""

    events: int = 0
    statements: collections.Counter[str] = field(default_factory=collections.Counter)  # shape -> executions
    round_trips: int | None = None  # PostgreSQL only
    syncs: int | None = None  # PostgreSQL: Sync + Query messages
    bare_trips: int | None = None  # PostgreSQL: round trips that ran no statement (a prepare: Parse + Sync)
    trips: collections.Counter[str] = field(default_factory=collections.Counter)  # what one round trip ran
    connections: int = 0

    @property
    def total(self) -> int:
        return sum(self.statements.values())

    @property
    def tx_control(self) -> int:
        return sum(n for s, n in self.statements.items() if kind_of(s) in TX_WORDS | {"ROLLBACK TO"})

    def per_event(self, n: float | None) -> float | None:
        return None if n is None else n / self.events

    def by_kind(self) -> collections.Counter[str]:
        out: collections.Counter[str] = collections.Counter()
        for s, n in self.statements.items():
            out[kind_of(s)] += n
        return out


class SqliteTrace:
    """``set_trace_callback`` on sqlite3 connections: every statement executed
    (an ``executemany`` row counts once, as SQLite runs the statement once per row)."""

    def __init__(self, conns: Sequence[sqlite3.Connection], counts: Counts) -> None:
        self.conns, self.counts = list(conns), counts

    def start(self) -> None:
        seen = self.counts.statements

        def trace(sql: str) -> None:
            seen[normalize(sql)] += 1

        for conn in self.conns:
            conn.set_trace_callback(trace)

    def stop(self) -> None:
        for conn in self.conns:
            try:
                conn.set_trace_callback(None)
            except sqlite3.ProgrammingError:
                pass


_MESSAGE = re.compile(r"^([FB])\t(\d+)\t(\w+)\t?(.*)$")
_TWO_NAMES = re.compile(r'^\s*"([^"]*)" "([^"]*)"')
_ONE_NAME = re.compile(r'^\s*"([^"]*)"')
_PARSE = re.compile(r'^\s*"([^"]*)" "(.*)"', re.DOTALL)
_QUERY = re.compile(r'^\s*"(.*)"', re.DOTALL)


def _short(shape: str) -> str:
    """A statement in a few words: its kind and the table (or function) it is about."""
    words = shape.replace("(", " ").replace(")", " ").split()
    if not words:
        return "?"
    upper = [w.upper() for w in words]

    def after(marker: str, start: int = 0) -> str:
        i = upper.index(marker, start) if marker in upper[start:] else -1
        return words[i + 1] if 0 <= i < len(words) - 1 else ""

    head = upper[0]
    if head in ("SAVEPOINT", "RELEASE", "SET"):
        return " ".join(words[:2])
    if head in TX_WORDS:
        return head
    if head == "WITH":
        for verb in ("INSERT", "UPDATE", "DELETE"):
            if verb in upper:
                i = upper.index(verb)
                target = after("INTO", i) if verb == "INSERT" else after("FROM", i) if verb == "DELETE" else (
                    words[i + 1] if i + 1 < len(words) else "")
                return f"WITH {verb} {target}".strip()
        return "WITH " + after("FROM")
    if head == "INSERT":
        return "INSERT " + after("INTO")
    if head == "UPDATE":
        return " ".join(words[:2])
    if head == "DELETE":
        return "DELETE " + after("FROM")
    if head == "SELECT":
        return "SELECT " + (after("FROM") or (words[1] if len(words) > 1 else ""))
    return head


def parse_trace(text: str, prepared: dict[str, str] | None = None) -> Counts:
    """Statements and round trips from a libpq protocol trace (timestamps
    suppressed, regress mode).  A statement: a simple-protocol ``Query`` or an
    extended-protocol ``Execute`` (its text found through ``Bind`` and
    ``Parse``).  A round trip: a run of frontend messages followed by a
    backend message — the client sent, then had to read.  ``prepared``: the
    statements the connection had prepared before the trace started (name ->
    text), from ``pg_prepared_statements``."""
    messages: list[list[str]] = []
    for line in text.split("\n"):
        m = _MESSAGE.match(line)
        if m:
            messages.append([m.group(1), m.group(3), m.group(4)])
        elif messages and line:
            messages[-1][2] += "\n" + line  # a statement's text may span lines
    counts = Counts(round_trips=0, syncs=0, bare_trips=0)
    prepared = dict(prepared or {})
    portals: dict[str, str] = {}
    previous = "B"
    executed = False  # did the current run of frontend messages run a statement?
    sent: list[str] = []  # the statements of the current run, shortened
    for direction, kind, body in messages:
        if direction == "B" and previous == "F":
            counts.round_trips += 1  # type: ignore[operator]
            if not executed:
                counts.bare_trips += 1  # type: ignore[operator]
            counts.trips[" ; ".join(sent) if sent else "(prepare only)"] += 1
        if direction == "F" and previous == "B":
            executed = False
            sent = []
        previous = direction
        if direction != "F":
            continue
        if kind == "Query":
            m = _QUERY.match(body)
            shape = normalize(m.group(1) if m else body)
            counts.statements[shape] += 1
            counts.syncs += 1  # type: ignore[operator]
            executed = True
            sent.append(_short(shape))
        elif kind == "Sync":
            counts.syncs += 1  # type: ignore[operator]
        elif kind == "Parse":
            m = _PARSE.match(body)
            if m:
                prepared[m.group(1)] = m.group(2)
        elif kind == "Bind":
            m = _TWO_NAMES.match(body)
            if m:
                portals[m.group(1)] = prepared.get(m.group(2), "?unknown prepared statement")
        elif kind == "Execute":
            m = _ONE_NAME.match(body)
            text = portals.get(m.group(1) if m else "", "?unknown portal")
            shape = normalize(text)
            counts.statements[shape] += 1
            executed = True
            sent.append(_short(shape))
    return counts


class PgTrace:
    """libpq's protocol trace on psycopg connections, into temporary files."""

    def __init__(self, conns: Sequence[Any], counts: Counts, tmp: str) -> None:
        self.conns, self.counts, self.tmp = list(conns), counts, tmp
        self.files: list[tuple[Any, str, int, dict[str, str]]] = []

    def start(self) -> None:
        from psycopg import pq

        for conn in self.conns:
            # The statements prepared before the trace starts (psycopg prepares a
            # statement on its 5th use): their text is not in the trace, so read
            # it from the server, at libpq level (psycopg's own cache untouched).
            if conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
                raise RuntimeError("a traced connection is inside a transaction at the start of the count")
            res = conn.pgconn.exec_(b"SELECT name, statement FROM pg_prepared_statements")
            if res.status != pq.ExecStatus.TUPLES_OK:
                raise RuntimeError(f"cannot read pg_prepared_statements: {res.error_message!r}")
            known = {
                (res.get_value(i, 0) or b"").decode(): (res.get_value(i, 1) or b"").decode()
                for i in range(res.ntuples)
            }
            fd, path = tempfile.mkstemp(prefix="pgtrace-", dir=self.tmp)
            conn.pgconn.trace(fd)
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            self.files.append((conn, path, fd, known))

    def stop(self) -> None:
        for conn, path, fd, known in self.files:
            conn.pgconn.untrace()  # flushes the trace
            try:
                os.close(fd)
            except OSError:
                pass  # closed with the trace stream
            with open(path, encoding="utf-8", errors="replace") as f:
                got = parse_trace(f.read(), known)
            os.unlink(path)
            self.counts.statements.update(got.statements)
            self.counts.round_trips = (self.counts.round_trips or 0) + (got.round_trips or 0)
            self.counts.syncs = (self.counts.syncs or 0) + (got.syncs or 0)
            self.counts.bare_trips = (self.counts.bare_trips or 0) + (got.bare_trips or 0)
            self.counts.trips.update(got.trips)
        self.files.clear()


def tracer(conns: Sequence[Any], counts: Counts, tmp: str) -> list[Any]:
    lite = [c for c in conns if isinstance(c, sqlite3.Connection)]
    pg = [c for c in conns if not isinstance(c, sqlite3.Connection)]
    out: list[Any] = []
    if lite:
        out.append(SqliteTrace(lite, counts))
    if pg:
        counts.round_trips = counts.round_trips or 0
        counts.syncs = counts.syncs or 0
        out.append(PgTrace(pg, counts, tmp))
    return out


def verify_pg_counting(dsn: str, tmp: str) -> list[tuple[str, int, int, int, int]]:
    """The round-trip and statement counts on cases known by construction;
    raises if the method is wrong.  Returns (case, statements, expected,
    round trips, expected)."""
    import psycopg

    out = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE rf_trace_check(a int)")

        def plain() -> None:
            conn.execute("BEGIN")
            conn.execute("INSERT INTO rf_trace_check VALUES (%s)", (1,))
            conn.execute("INSERT INTO rf_trace_check VALUES (%s)", (2,))
            conn.execute("COMMIT")

        def pipelined() -> None:
            with conn.pipeline():
                conn.execute("BEGIN")
                conn.execute("INSERT INTO rf_trace_check VALUES (%s)", (1,))
                conn.cursor().executemany("INSERT INTO rf_trace_check VALUES (%s)", [(2,), (3,)])
                conn.execute("COMMIT")

        known = (
            ("`conn.execute(\"SELECT 1\")`, autocommit", lambda: conn.execute("SELECT 1"), 1, 1),
            ("BEGIN; 2 INSERTs; COMMIT, one `execute` each", plain, 4, 4),
            ("the same (an `executemany` of 2 rows) in one `conn.pipeline()`", pipelined, 5, 1),
        )
        for label, fn, statements, trips in known:
            counts = Counts(events=1)
            (t,) = tracer([conn], counts, tmp)
            t.start()
            fn()
            t.stop()
            out.append((label, counts.total, statements, counts.round_trips or 0, trips))
            if counts.total != statements or counts.round_trips != trips:
                raise AssertionError(
                    f"counting method check failed on {label}: {counts.total} statements ({statements} "
                    f"expected), {counts.round_trips} round trips ({trips} expected)"
                )
    return out


def backend_cpu_ns(conns: Sequence[Any]) -> int | None:
    """On-CPU nanoseconds of the PostgreSQL backends serving ``conns`` (None if unreadable)."""
    total = 0
    for conn in conns:
        if isinstance(conn, sqlite3.Connection):
            continue
        try:
            with open(f"/proc/{conn.info.backend_pid}/schedstat", encoding="ascii") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None
    return total


# -- the raw psycopg references --------------------------------------------------------------------

PG_PRODUCER_DDL = (
    """CREATE TABLE flow(flow_id text PRIMARY KEY, seq integer NOT NULL, state text NOT NULL,
                         data text NOT NULL)""",
    """CREATE TABLE outbox(pos bigserial PRIMARY KEY, event_id text NOT NULL UNIQUE, flow_id text NOT NULL,
                           seq integer NOT NULL, body text NOT NULL, delivered boolean NOT NULL DEFAULT false)""",
    "CREATE INDEX outbox_pending ON outbox(pos) WHERE NOT delivered",
    # only the advance-alone reference writes it: the library's advance writes a delivery row
    "CREATE TABLE delivery(consumer text NOT NULL, pos bigint NOT NULL, PRIMARY KEY (consumer, pos))",
)
PG_CONSUMER_DDL = (
    """CREATE TABLE inbox(event_id text PRIMARY KEY, flow_id text NOT NULL, seq integer NOT NULL,
                          body text NOT NULL, applied boolean NOT NULL DEFAULT false, UNIQUE (flow_id, seq))""",
    "CREATE INDEX inbox_pending ON inbox(flow_id, seq) WHERE NOT applied",
    """CREATE TABLE projection(flow_id text PRIMARY KEY, state text NOT NULL, last_seq integer NOT NULL,
                               data text NOT NULL, view text NOT NULL)""",
)
PG_UPSERT_FLOW = (
    "INSERT INTO flow(flow_id, seq, state, data) VALUES (%s, %s, %s, %s) ON CONFLICT (flow_id) DO UPDATE "
    "SET seq = excluded.seq, state = excluded.state, data = excluded.data"
)
PG_INSERT_OUTBOX = "INSERT INTO outbox(event_id, flow_id, seq, body) VALUES (%s, %s, %s, %s)"
PG_INSERT_DELIVERY = "INSERT INTO delivery(consumer, pos) VALUES ('default', lastval())"
PG_MARK = "UPDATE outbox SET delivered = true WHERE event_id = %s"
PG_INSERT_INBOX = "INSERT INTO inbox(event_id, flow_id, seq, body) VALUES (%s, %s, %s, %s)"
PG_INSERT_INBOX_APPLIED = "INSERT INTO inbox(event_id, flow_id, seq, body, applied) VALUES (%s, %s, %s, %s, true)"
PG_UPSERT_PROJECTION = (
    "INSERT INTO projection(flow_id, state, last_seq, data, view) VALUES (%s, %s, %s, %s, %s) "
    "ON CONFLICT (flow_id) DO UPDATE SET state = excluded.state, last_seq = excluded.last_seq, "
    "data = excluded.data, view = excluded.view"
)
PG_MARK_APPLIED = "UPDATE inbox SET applied = true WHERE event_id = %s"


class RawPg:
    """``raw.py``'s minimal design in PostgreSQL with plain psycopg: two
    schemas, autocommit connections, every transaction ``BEGIN`` ... ``COMMIT``
    sent as one pipeline (one round trip), ``synchronous_commit`` at the
    server's setting (on) except for the delivered mark, committed with
    ``SET LOCAL synchronous_commit = off`` as the library commits its
    accepted mark.  No validation, no guarding read, no JSON."""

    def __init__(self, dsn: str, producer_schema: str, consumer_schema: str) -> None:
        import psycopg

        self.p = psycopg.connect(dsn, autocommit=True)
        self.c = psycopg.connect(dsn, autocommit=True)
        for conn, schema, ddl in ((self.p, producer_schema, PG_PRODUCER_DDL),
                                  (self.c, consumer_schema, PG_CONSUMER_DDL)):
            conn.execute(f'CREATE SCHEMA "{schema}"')
            conn.execute(f'SET search_path TO "{schema}"')
            with conn.transaction():
                for statement in ddl:
                    conn.execute(statement)

    @property
    def conns(self) -> list[Any]:
        return [self.p, self.c]

    @staticmethod
    def _tx(conn: Any, work: Callable[[Any], None], lazy: bool = False) -> None:
        with conn.pipeline():
            conn.execute("BEGIN")
            if lazy:
                conn.execute("SET LOCAL synchronous_commit = off")
            work(conn)
            conn.execute("COMMIT")

    # one event ----------------------------------------------------------------
    def advance(self, e: Event, delivery: bool = False) -> None:
        def work(conn: Any) -> None:
            conn.execute(PG_UPSERT_FLOW, (e.flow_id, e.seq, e.kind, e.data))
            conn.execute(PG_INSERT_OUTBOX, (e.event_id, e.flow_id, e.seq, e.body))
            if delivery:
                conn.execute(PG_INSERT_DELIVERY)

        self._tx(self.p, work)

    def receive(self, e: Event) -> None:
        self._tx(self.c, lambda c: c.execute(PG_INSERT_INBOX, (e.event_id, e.flow_id, e.seq, e.body)))

    def mark(self, e: Event) -> None:
        self._tx(self.p, lambda c: c.execute(PG_MARK, (e.event_id,)), lazy=True)

    def apply(self, e: Event) -> None:
        def work(conn: Any) -> None:
            conn.execute(PG_UPSERT_PROJECTION, (e.flow_id, e.kind, e.seq, e.data, e.view))
            conn.execute(PG_MARK_APPLIED, (e.event_id,))

        self._tx(self.c, work)

    def receive_apply(self, e: Event) -> None:
        def work(conn: Any) -> None:
            conn.execute(PG_INSERT_INBOX_APPLIED, (e.event_id, e.flow_id, e.seq, e.body))
            conn.execute(PG_UPSERT_PROJECTION, (e.flow_id, e.kind, e.seq, e.data, e.view))

        self._tx(self.c, work)

    def two_step(self, e: Event) -> None:
        """The library's two-step commits: 3 durable, the mark not."""
        self.advance(e)
        self.receive(e)
        self.mark(e)
        self.apply(e)

    def one_rna(self, e: Event) -> None:
        """The receive-and-apply commits: 2 durable, the mark not."""
        self.advance(e)
        self.receive_apply(e)
        self.mark(e)

    # a batch ------------------------------------------------------------------
    def batch(self, events: Sequence[Event]) -> None:
        """The batched path's commits, one per step over the whole batch, ``executemany``."""

        def advance(conn: Any) -> None:
            cur = conn.cursor()
            cur.executemany(PG_UPSERT_FLOW, [(e.flow_id, e.seq, e.kind, e.data) for e in events])
            cur.executemany(PG_INSERT_OUTBOX, [(e.event_id, e.flow_id, e.seq, e.body) for e in events])

        def receive(conn: Any) -> None:
            conn.cursor().executemany(PG_INSERT_INBOX, [(e.event_id, e.flow_id, e.seq, e.body) for e in events])

        def mark(conn: Any) -> None:
            conn.cursor().executemany(PG_MARK, [(e.event_id,) for e in events])

        def apply(conn: Any) -> None:
            cur = conn.cursor()
            cur.executemany(PG_UPSERT_PROJECTION, [(e.flow_id, e.kind, e.seq, e.data, e.view) for e in events])
            cur.executemany(PG_MARK_APPLIED, [(e.event_id,) for e in events])

        self._tx(self.p, advance)
        self._tx(self.c, receive)
        self._tx(self.p, mark, lazy=True)
        self._tx(self.c, apply)

    def check(self, events: Sequence[Event], warm: int, delivered: bool = True) -> None:
        outbox, undelivered = self.p.execute(
            "SELECT count(*), count(*) FILTER (WHERE NOT delivered) FROM outbox").fetchone()
        if outbox != warm + len(events) or (delivered and undelivered):
            raise AssertionError(f"raw psycopg: {outbox} outbox rows ({warm + len(events)} expected), "
                                 f"{undelivered} undelivered")
        if not delivered:
            return
        inbox, unapplied = self.c.execute(
            "SELECT count(*), count(*) FILTER (WHERE NOT applied) FROM inbox").fetchone()
        if inbox != warm + len(events) or unapplied:
            raise AssertionError(f"raw psycopg: {inbox} inbox rows, {unapplied} unapplied")
        last = {e.flow_id: e.seq for e in events}
        got = dict(self.c.execute("SELECT flow_id, last_seq FROM projection WHERE flow_id = ANY(%s)",
                                  (list(last),)).fetchall())
        if got != last:
            raise AssertionError("raw psycopg: projections do not match the events")

    def close(self) -> None:
        self.p.close()
        self.c.close()


# -- opening a side --------------------------------------------------------------------------------


@dataclass
class Env:
    """Where sides are opened: the temporary directory and (optionally) the server."""

    tmp: str
    server: Any = None  # postgres.Server
    labels: int = 0

    def label(self, key: Key) -> str:
        self.labels += 1
        return f"{self.labels}{key[0][:2]}{key[1][:3]}{key[2][:3]}".lower().replace(" ", "").replace("-", "")


@dataclass
class Opened:
    session: cases.Session
    remove: Callable[[], None]


def _advance(producer: Any, e: Event) -> Any:
    return producer.advance(e.event_id, e.flow_id, expected_seq=e.seq - 1, kind=e.kind, payload=e.payload)


def _expect(results: Sequence[Any], status: str, what: str) -> None:
    bad = [r for r in results if getattr(r, "status", None) != status]
    if bad:
        raise AssertionError(f"{what}: {len(bad)} of {len(results)} results were not {status!r}, e.g. {bad[0]!r}")


def _store_counts(engine: str, env: Env, producer_loc: str, consumer_loc: str) -> tuple[int, int, int, int, int, int]:
    """Read the stores directly (after the clock): outbox rows, distinct event ids,
    deliveries accepted; inbox rows, distinct event ids, applied."""
    p_sql = ("SELECT (SELECT count(*) FROM {s}outbox), (SELECT count(DISTINCT event_id) FROM {s}outbox), "
             "(SELECT count(*) FROM {s}delivery WHERE state = 'accepted')")
    c_sql = "SELECT count(*), count(DISTINCT event_id), count(*) FILTER (WHERE state = 'applied') FROM {s}inbox"
    out: list[int] = []
    for loc, text in ((producer_loc, p_sql), (consumer_loc, c_sql)):
        if engine == SQLITE:
            conn = sqlite3.connect(loc)
            try:
                out += list(conn.execute(text.format(s="")).fetchone())
            finally:
                conn.close()
        else:
            schema = loc.rsplit("#", 1)[1]
            out += list(env.server.sql(text.format(s=f'"{schema}".'))[0])
    return tuple(out)  # type: ignore[return-value]


def open_library(key: Key, env: Env, events: list[Event], warm: list[Event]) -> Opened:
    import postgres

    engine, path, _ = key
    stores = postgres.Stores(engine, env.server, env.tmp, env.label(key))
    producer = Producer(stores.producer, RESERVATION)
    consumer = Consumer(stores.consumer, RESERVATION)
    receiver: Any = consumer
    if path == RNA:
        applying = getattr(consumer, "applying", None)
        if applying is None:
            raise RuntimeError("the installed Consumer has no applying(): the receive-and-apply path cannot run")
        receiver = applying()
    for e in warm:  # binds the consumer, fills the statement caches
        _expect([_advance(producer, e)], "committed", "warm-up advance")
        _expect([relay(producer, receiver)], "accepted", "warm-up relay")
        if path != RNA:
            _expect([consumer.apply_next(e.flow_id)], "applied", "warm-up apply_next")
    results: dict[str, list[Any]] = {"advance": [], "relay": [], "apply_next": []}
    applied: list[int] = []
    if path == ADVANCE:
        units = [lambda e=e: results["advance"].append(_advance(producer, e)) for e in events]
    elif path in (TWO_STEP, RNA):
        def unit(e: Event) -> None:
            results["advance"].append(_advance(producer, e))
            results["relay"].append(relay(producer, receiver))
            if path == TWO_STEP:
                results["apply_next"].append(consumer.apply_next(e.flow_id))

        units = [lambda e=e: unit(e) for e in events]
    else:
        def batch(chunk: Sequence[Event]) -> None:
            with producer.batch() as b:
                for e in chunk:
                    _advance(b, e)
            results["advance"].extend(b.results)
            results["relay"].extend(relay_batch(producer, consumer, limit=BATCH).results)
            drained = consumer.process_all(batch_size=BATCH)
            applied.append(sum(d.applied for d in drained.values()))

        units = [lambda c=c: batch(c) for c in chunks(events, BATCH)]

    def check() -> None:
        n, w = len(events), len(warm)
        _expect(results["advance"], "committed", f"{engine} {path}: advance")
        if len(results["advance"]) != n:
            raise AssertionError(f"{engine} {path}: {len(results['advance'])} advances, {n} expected")
        out_rows, out_ids, accepted, in_rows, in_ids, done = _store_counts(
            engine, env, stores.producer, stores.consumer)
        if out_rows != n + w or out_ids != n + w:
            raise AssertionError(f"{engine} {path}: {out_rows} outbox rows, {out_ids} ids, {n + w} expected")
        if path == ADVANCE:
            if accepted != w:
                raise AssertionError(f"{engine} advance: {accepted} deliveries accepted, {w} expected")
            return
        _expect(results["relay"], "accepted", f"{engine} {path}: relay")
        if path == TWO_STEP:
            _expect(results["apply_next"], "applied", f"{engine} two-step: apply_next")
        if path == BATCHED and sum(applied) != n:
            raise AssertionError(f"{engine} batched: process_all applied {sum(applied)}, {n} expected")
        if accepted != n + w or in_rows != n + w or in_ids != n + w or done != n + w:
            raise AssertionError(
                f"{engine} {path}: {accepted} deliveries accepted, {in_rows} inbox rows, {in_ids} ids, "
                f"{done} applied; {n + w} expected of each")
        if relay(producer, consumer).status != "idle":
            raise AssertionError(f"{engine} {path}: the relay still had an event to send")
        last: dict[str, int] = {}
        for e in warm + events:
            last[e.flow_id] = e.seq
        wrong = [f for f, seq in last.items() if (consumer.projection(f) or {}).get("last_seq") != seq]
        if wrong:
            raise AssertionError(f"{engine} {path}: {len(wrong)} flows not at their last event, e.g. {wrong[0]}")

    conns = find_connections(producer, consumer, receiver)
    if not conns:
        raise RuntimeError(
            f"{engine} {path}: no sqlite3/psycopg connection found in the Producer/Consumer objects; "
            "the counting cannot work with this version of the library")
    session = cases.Session({"main": units}, BATCH if path == BATCHED else 1, conns, check,
                            [producer.close, consumer.close])
    session.roots = (producer, consumer, receiver)  # type: ignore[attr-defined]
    return Opened(session, stores.remove)


def open_reference(key: Key, env: Env, events: list[Event], warm: list[Event]) -> Opened:
    import postgres

    engine, path, who = key
    if engine == POSTGRES:
        p_loc, c_loc = env.server.location(env.label(key) + "p"), env.server.location(env.label(key) + "c")
        pipe = RawPg(env.server.cluster.dsn(postgres.DATABASE), p_loc.rsplit("#", 1)[1], c_loc.rsplit("#", 1)[1])
        for e in warm:
            pipe.two_step(e)
        if path == ADVANCE:
            units = [lambda e=e: pipe.advance(e, delivery=True) for e in events]
            per, check = 1, lambda: pipe.check(events, len(warm), delivered=False)
        elif path == BATCHED:
            units = [lambda c=c: pipe.batch(c) for c in chunks(events, BATCH)]
            per, check = BATCH, lambda: pipe.check(events, len(warm))
        else:
            one = pipe.two_step if path == TWO_STEP else pipe.one_rna
            units = [lambda e=e: one(e) for e in events]
            per, check = 1, lambda: pipe.check(events, len(warm))

        def remove() -> None:
            env.server.drop(p_loc)
            env.server.drop(c_loc)

        return Opened(cases.Session({"main": units}, per, pipe.conns, check, [pipe.close]), remove)
    workdir = tempfile.mkdtemp(prefix=env.label(key) + "-", dir=env.tmp)
    p_path, c_path = os.path.join(workdir, "producer.db"), os.path.join(workdir, "consumer.db")
    if who == FLOOR:
        create_files(p_path, c_path)
        fp, fc = cases.open_floor(p_path, c_path, warm)

        def floor_check() -> None:
            conn = sqlite3.connect(p_path)
            try:
                rows, deliveries = conn.execute(
                    "SELECT (SELECT count(*) FROM outbox), (SELECT count(*) FROM delivery)").fetchone()
            finally:
                conn.close()
            if rows != len(warm) + len(events) or deliveries != rows:
                raise AssertionError(f"floor advance: {rows} outbox rows, {deliveries} deliveries")

        session = cases.Session({"main": [lambda e=e: fp.advance(e) for e in events]}, 1, [fp.conn],
                                floor_check, [fp.close, fc.close])
    else:
        pipeline = cases.open_raw(who, p_path, c_path, warm)
        if path == BATCHED:
            units = [lambda c=c: pipeline.batch(c) for c in chunks(events, BATCH)]
            per = BATCH
        else:
            units = [lambda e=e: pipeline.one(e) for e in events]
            per = 1
        session = cases.Session({"main": units}, per, pipeline.conns,
                                lambda: raw.check(pipeline, events), [pipeline.close])
    return Opened(session, lambda: shutil.rmtree(workdir, ignore_errors=True))


def open_side(key: Key, env: Env, n: int, rng: random.Random) -> Opened:
    warm, events = make_events(3, rng), make_events(n, rng)
    return (open_library if key[2] == LIB else open_reference)(key, env, events, warm)


def _events(group: str, sizes: Sizes, audit: bool) -> int:
    if group == "batched":
        return sizes.audit_batched if audit else sizes.batched
    if audit:
        return sizes.audit_single
    return sizes.single if group == "advance" else sizes.e2e


# -- the runs --------------------------------------------------------------------------------------


def count_group(group: str, keys: list[Key], env: Env, sizes: Sizes) -> dict[Key, Counts]:
    """The counting run: one side at a time, traced, then checked."""
    out: dict[Key, Counts] = {}
    n = _events(group, sizes, audit=True)
    for key in keys:
        opened = open_side(key, env, n, random.Random(777))
        try:
            session = opened.session
            counts = Counts(connections=len(session.conns))
            tracers = tracer(session.conns, counts, env.tmp)
            for t in tracers:
                t.start()
            try:
                for unit in session.phases["main"]:
                    unit()
            finally:
                for t in tracers:
                    t.stop()
            counts.events = len(session.phases["main"]) * session.per_unit
            unknown = [shape for shape in counts.statements if shape.startswith("?unknown")]
            if unknown:
                raise RuntimeError(f"{key}: statements whose text the trace did not show: {unknown}")
            roots = getattr(session, "roots", None)
            if roots is not None:
                now = find_connections(*roots)
                if {id(c) for c in now} != {id(c) for c in session.conns}:
                    raise RuntimeError(f"{key}: the library opened or replaced a connection during the "
                                       "counting run; its statements would be missed")
            session.check()
            out[key] = counts
        finally:
            opened.session.close()
            opened.remove()
    return out


@dataclass
class Timed:
    samples: dict[Key, list[Sample]] = field(default_factory=dict)
    server_ns: dict[Key, list[float]] = field(default_factory=dict)  # per event, per round

    def us(self, key: Key) -> float:
        return median(s.us_per_event for s in self.samples[key])

    def cpu(self, key: Key) -> float:
        return median(s.cpu_us_per_event for s in self.samples[key])

    def server_us(self, key: Key) -> float | None:
        values = self.server_ns.get(key)
        return median(v / 1000 for v in values) if values else None

    def time_ratios(self, lib: Key, ref: Key) -> list[float]:
        return [a.us_per_event / b.us_per_event for a, b in zip(self.samples[lib], self.samples[ref])]

    def cpu_ratios(self, lib: Key, ref: Key) -> list[float]:
        return [a.cpu_us_per_event / b.cpu_us_per_event for a, b in zip(self.samples[lib], self.samples[ref])]


def time_group(group: str, keys: list[Key], env: Env, sizes: Sizes, r: int, out: Timed) -> None:
    """One round: every side of the group on fresh stores, interleaved in blocks."""
    n = _events(group, sizes, audit=False)
    block = sizes.batched_block if group == "batched" else sizes.block
    order = keys if r % 2 == 0 else keys[::-1]
    opened: dict[Key, Opened] = {}
    try:
        if env.server is not None:
            env.server.checkpoint()
        for key in order:
            opened[key] = open_side(key, env, n, random.Random(1000 + r))  # same events on every side
        before = {k: backend_cpu_ns(o.session.conns) for k, o in opened.items() if k[0] == POSTGRES}
        samples = interleave({k: o.session for k, o in opened.items()}, block, offset=r)
        after = {k: backend_cpu_ns(o.session.conns) for k, o in opened.items() if k[0] == POSTGRES}
        for key, o in opened.items():
            o.session.check()
        for key in keys:
            sample = samples[(key, "main")]  # type: ignore[index]
            out.samples.setdefault(key, []).append(sample)
            if key in before and before[key] is not None and after[key] is not None:
                out.server_ns.setdefault(key, []).append((after[key] - before[key]) / sample.events)  # type: ignore[operator]
    finally:
        for o in opened.values():
            o.session.close()
            o.remove()


# -- the report ------------------------------------------------------------------------------------


def _md(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _f(v: float | None, digits: int = 1) -> str:
    if v is None:
        return "—"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.{digits}f}"


def _x(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def _span(values: list[float]) -> str:
    return f"{min(values):.2f}..{max(values):.2f}"


@dataclass
class Report:
    engines: list[str]
    counts: dict[Key, Counts]
    timed: Timed
    rounds: int
    sizes: Sizes
    verified: list[tuple[str, int, int, int, int]]

    def has(self, key: Key) -> bool:
        return key in self.counts and key in self.timed.samples

    def side_row(self, key: Key, ref: Key | None) -> list[str]:
        c, t = self.counts[key], self.timed
        stmts, tx = c.per_event(c.total), c.per_event(c.tx_control)
        rt = c.per_event(c.round_trips)
        rt_text = _f(rt, 2) if not c.bare_trips else f"{_f(rt, 2)} ({_f(c.per_event(c.bare_trips), 2)})"
        cpu, us, srv = t.cpu(key), t.us(key), t.server_us(key)
        row = [f"{_f(stmts, 2)} ({_f(tx, 2)})", rt_text, _f(cpu), _f(srv), _f(us), f"{1e6 / us:,.0f}"]
        if ref is None:
            return row + ["", "", "", ""]
        rc = self.counts[ref]
        rate = [b.us_per_event / a.us_per_event for a, b in zip(t.samples[key], t.samples[ref])]
        return row + [
            _x(stmts, rc.per_event(rc.total)),
            _x(rt, rc.per_event(rc.round_trips)),
            f"{median(t.cpu_ratios(key, ref)):.2f}x",
            f"{median(rate):.2f}x ({_span(rate)})",
        ]

    def main_table(self, engine: str) -> str:
        rows = []
        for path in PATHS:
            lib = (engine, path, LIB)
            if not self.has(lib):
                continue
            refs = [r for r in REFERENCES[(engine, path)] if self.has(r)]
            rows.append([PATH_TITLES[path], "**library**"] + self.side_row(lib, None))
            for ref in refs:
                rows.append(["", f"vs {WHO_TITLES[ref[2]]}"] + self.side_row(ref, None)[:6] + self.side_row(lib, ref)[6:])
        return _md(
            ["path", "side", "statements/event (of them BEGIN/COMMIT/SAVEPOINT...)",
             "round trips/event (of them prepare only)",
             "client CPU µs/event", "server CPU µs/event", "wall µs/event", "events/s",
             "statements lib/raw", "round trips lib/raw", "CPU lib/raw", "events/s lib/raw (spread)"],
            rows,
        )

    def kinds_table(self, engine: str) -> str:
        rows = []
        keys = [k for k in self.counts if k[0] == engine]
        for key in sorted(keys, key=lambda k: (PATHS.index(k[1]), k[2] != LIB, k[2])):
            c = self.counts[key]
            kinds = c.by_kind()
            shown = ", ".join(f"{k} {_f(c.per_event(n), 2)}" for k, n in kinds.most_common())
            rows.append([PATH_TITLES[key[1]] if key[2] == LIB else f"{PATH_TITLES[key[1]]}: {WHO_TITLES[key[2]]}",
                         _f(c.per_event(c.total), 2), shown])
        return _md(["side", "statements/event", "by kind, per event"], rows)

    def targets(self) -> list[tuple[str, str, str, bool | None]]:
        """(target, reference, measured, met)."""
        t, out = self.timed, []

        def rate(lib: Key, ref: Key) -> list[float] | None:
            if not (self.has(lib) and self.has(ref)):
                return None
            return [b.us_per_event / a.us_per_event for a, b in zip(t.samples[lib], t.samples[ref])]

        for text, lib, ref, limit, kind in (
            ("batched ≥ 0.5× the minimal raw batched pipeline's events/s (SQLite)",
             (SQLITE, BATCHED, LIB), (SQLITE, BATCHED, RAW4), 0.5, "rate"),
            ("unbatched receive-and-apply ≥ 1.4× the raw 4-commit pipeline's events/s (SQLite)",
             (SQLITE, RNA, LIB), (SQLITE, TWO_STEP, RAW4), 1.4, "rate"),
            ("`advance` ≤ 1.15× a raw one-commit write of the same rows (SQLite, the floor's advance), time",
             (SQLITE, ADVANCE, LIB), (SQLITE, ADVANCE, FLOOR), 1.15, "time"),
            (("PostgreSQL end to end (two-step, unbatched) ≥ 0.7× a raw psycopg pipeline doing the same "
             "durable commits, events/s"), (POSTGRES, TWO_STEP, LIB), (POSTGRES, TWO_STEP, RAWPG), 0.7, "rate"),
        ):
            values = rate(lib, ref)
            if values is None:
                out.append((text, "", "not measured in this run", None))
                continue
            if kind == "time":
                values = [1 / v for v in values]
                m = median(values)
                out.append((text, WHO_TITLES[ref[2]], f"{m:.2f}x ({_span(values)})", m <= limit))
            else:
                m = median(values)
                out.append((text, WHO_TITLES[ref[2]], f"{m:.2f}x ({_span(values)})", m >= limit))
            if text.startswith("`advance`"):
                adv = (POSTGRES, ADVANCE, LIB)
                if adv in self.counts:
                    rt = self.counts[adv].per_event(self.counts[adv].round_trips) or 0.0
                    out.append(("PostgreSQL `advance` in at most 3 round trips", "(count)",
                                f"{rt:.2f} round trips per advance", rt <= 3.0))
                else:
                    out.append(("PostgreSQL `advance` in at most 3 round trips", "", "not measured in this run",
                                None))
        for path in (RNA, BATCHED):  # shown, no target of their own
            lib, ref = (POSTGRES, path, LIB), (POSTGRES, path, RAWPG)
            values = rate(lib, ref)
            if values is not None:
                out.append((f"(no target) PostgreSQL {path} vs raw psycopg, events/s", WHO_TITLES[RAWPG],
                            f"{median(values):.2f}x ({_span(values)})", None))
        return out

    def targets_table(self) -> str:
        rows = [[text, ref, measured, "—" if met is None else ("yes" if met else "**no**")]
                for text, ref, measured, met in self.targets()]
        return _md(["target (issue 23)", "reference", "measured (median of rounds; spread)", "met?"], rows)

    def top_tables(self, top: int = 12) -> str:
        parts = []
        for engine in self.engines:
            for path in PATHS:
                for who in (LIB,) + tuple(r[2] for r in REFERENCES[(engine, path)]):
                    key = (engine, path, who)
                    if key not in self.counts or (who != LIB and path == RNA and engine == SQLITE):
                        continue
                    if who != LIB and engine == SQLITE and who == RAW2:
                        continue  # raw 2-commit: like raw 4, fewer commits; its totals are in the main table
                    c = self.counts[key]
                    rows = []
                    for shape, n in c.statements.most_common(top):
                        text = shape if len(shape) <= 200 else shape[:197] + "..."
                        text = text.replace("|", "\\|").replace("`", "'")
                        rows.append([f"`{text}`", kind_of(shape), _f(c.per_event(n), 2)])
                    rest = c.total - sum(n for _, n in c.statements.most_common(top))
                    if rest:
                        rows.append([f"(the {len(c.statements) - top} other statements)", "", _f(c.per_event(rest), 2)])
                    if c.trips:
                        trips = [[f"`{t.replace('|', chr(92) + '|')}`", _f(c.per_event(n), 2)]
                                 for t, n in c.trips.most_common(12)]
                        rest_trips = (c.round_trips or 0) - sum(n for _, n in c.trips.most_common(12))
                        if rest_trips:
                            trips.append([f"(the {len(c.trips) - 12} other kinds)", _f(c.per_event(rest_trips), 2)])
                        rows_text = "\n\nRound trips, by the statements each one carried:\n\n" + _md(
                            ["statements sent in one round trip", "per event"], trips)
                    else:
                        rows_text = ""
                    title = f"### {engine}, {PATH_TITLES[path]}: {WHO_TITLES[who]}"
                    parts.append(f"{title}\n\n{_f(c.per_event(c.total), 2)} statements per event"
                                 + ("" if c.round_trips is None else
                                    f", {_f(c.per_event(c.round_trips), 2)} round trips per event")
                                 + f" ({c.events} events counted, {c.connections} connections traced).\n\n"
                                 + _md(["statement (literals as ?)", "kind", "per event"], rows) + rows_text)
        return "\n\n".join(parts)

    def rounds_table(self) -> str:
        rows = []
        for key, samples in self.timed.samples.items():
            rows.append([f"{key[0]} {key[1]}: {WHO_TITLES[key[2]]}",
                         " ".join(f"{s.us_per_event:.0f}" for s in samples),
                         " ".join(f"{s.cpu_us_per_event:.0f}" for s in samples)])
        return _md(["side", "wall µs/event, round by round", "client CPU µs/event, round by round"], rows)

    def console(self) -> str:
        parts = []
        for engine in self.engines:
            parts += [f"{engine}:", self.main_table(engine), ""]
        parts += [self.targets_table()]
        return "\n".join(parts)


def markdown(report: Report, info: dict[str, str], settings: dict[str, str] | None, load: Load, elapsed: float,
             argv: list[str], quick: bool) -> str:
    s = report.sizes
    others = load.others_cpus
    out = [
        "# Statements, round trips and CPU per event, per path and engine",
        "",
        f"Generated by `python benchmarks/paths.py {' '.join(argv)}`".rstrip() + " — do not edit by hand; "
        "re-run to refresh. What is measured and how: "
        "[README.md](README.md#statements-round-trips-and-cpu-per-event-pathspy).",
        "",
    ]
    if quick:
        out += ["**Quick run: small sizes, figures not to quote.**", ""]
    versions = ""
    try:
        import psycopg

        versions = f"; psycopg {psycopg.__version__} (libpq {psycopg.pq.version()})"
    except ImportError:
        pass
    out += [
        (f"**Machine:** {info['platform']}; {info['cpu']}; {info['python']}; SQLite {info['sqlite']}{versions}; "
        f"filesystem {info['filesystem']}."),
        "",
        f"**Date:** {info['date']}. Total run time {elapsed:.0f} s, {report.rounds} interleaved rounds.",
        "",
        f"**Load:** 1-minute load average {load.samples[0][0]:.2f} at the start, up to {load.max1:.2f} during the "
        f"run, on {os.cpu_count()} CPUs" + ("" if others is None else
                                            f"; other processes kept {others:.2f} CPUs busy on average")
        + ". Timings on a shared machine are noisy: read the same-run ratios and the counts, not the absolute "
        "figures.",
        "",
    ]
    if settings:
        out += [
            "**Server:** PostgreSQL " + settings.get("server_version", "?") + ", private, started by this script "
            "through `tests/pg_cluster.py` (as `postgres.py` does), Unix socket, same machine; "
            + ", ".join(f"`{k}` = {v}" for k, v in settings.items() if k != "server_version") + ".",
            "",
        ]
    out += [
        "## What is measured",
        "",
        ("Each path runs on its library side and on a hand-written reference doing the same durable commits "
        "with the same row bytes (see the README): on SQLite the floor's one-commit `advance` (`floor.py`) and "
        "the minimal raw 4-commit and raw 2-durable-commit pipelines (`raw.py`, unbatched and batched); on "
        "PostgreSQL the raw psycopg pipelines of `paths.py` (`raw.py`'s minimal schema, each transaction one "
        "`conn.pipeline()`: one round trip; the library's durable commits, the delivered mark with "
        "`synchronous_commit = off` as the library's accepted mark)."),
        "",
        (f"* **Counts** come from one untimed counting run per side ({s.audit_single} events unbatched, "
        f"{s.audit_batched} batched, after a warm-up of one flow): every statement execution — SQLite's trace "
        "callback on each of the side's `sqlite3` connections (an `executemany` row counts once, as SQLite runs "
        "the statement once per row), and libpq's protocol trace (`pgconn.trace`) on each `psycopg` connection "
        "(a statement: a simple-protocol Query or an extended-protocol Execute). BEGIN / COMMIT / ROLLBACK / "
        "SAVEPOINT / RELEASE are in the totals and also counted apart. A **round trip** is a run of messages "
        "the client sent followed by the server's answer (a frontend-to-backend turn in the trace): in "
        "pipeline mode many statements share one. The connections are found by walking each side's objects "
        "(by type, not by private name); the run fails if a connection appears or is replaced meanwhile."),
        (f"* **Times** come from {report.rounds} rounds in which all sides of a group run interleaved in "
        f"blocks ({s.block} events unbatched, {s.batched_block} batches of 100 batched; order rotated) on fresh "
        f"stores, without tracing: {s.single} events per side for `advance`, {s.e2e} unbatched, {s.batched} "
        "batched. Medians over rounds; a ratio is the median of the per-round ratios. **Client CPU** is this "
        "process's CPU time (`time.process_time()`): producer and consumer are both in-process, and for "
        "SQLite it includes the database engine's work; for PostgreSQL it does **not** include the server's "
        "— shown apart as **server CPU**: the on-CPU time of the side's backends (`/proc/<pid>/schedstat`), "
        "without the WAL writer, checkpointer and other server processes."),
        ("* After every run each event is checked: committed, accepted and applied exactly once (store "
        "contents read directly: outbox, deliveries, inbox rows and ids, applied states; every projection at "
        "its flow's last event)."),
        "",
    ]
    if report.verified:
        out += [
            "**Method check** (run before the measurements; the run stops if one fails):",
            "",
            _md(["known case", "statements counted", "expected", "round trips counted", "expected"],
                [[a, str(b), str(c), str(d), str(e)] for a, b, c, d, e in report.verified]),
            "",
        ]
    out += ["## Targets", "", report.targets_table(), ""]
    for engine in report.engines:
        out += [
            f"## {engine}: per event, library and reference",
            "",
            ("Each path's library row, then each reference's own figures with the library/reference ratios on "
            "its line."),
            "",
            report.main_table(engine),
            "",
            "Statements by kind:",
            "",
            report.kinds_table(engine),
            "",
        ]
    out += [
        "## Appendix: which statements, per event",
        "",
        ("The most frequent statements of each side in the counting run (literals shown as `?`, lists folded), "
        "executions per event."),
        "",
        report.top_tables(),
        "",
        "## Rounds",
        "",
        report.rounds_table(),
        "",
    ]
    return "\n".join(out)


# -- main ------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: small sizes, 2 rounds (seconds)")
    parser.add_argument("--rounds", type=int, metavar="N", help="interleaved rounds (default 5, quick 2)")
    parser.add_argument("--only", action="append", choices=GROUPS, help="run only this group of paths")
    parser.add_argument("--engine", action="append", choices=("sqlite", "postgres"),
                        help="run only this engine (default both)")
    parser.add_argument("--write-results", action="store_true", help="write benchmarks/RESULTS-paths.md")
    parser.add_argument("--tmp", metavar="DIR", help="where the SQLite files go (default: system temp)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 5)
    if rounds < 1:
        parser.error("--rounds must be >= 1")
    sizes = Sizes.quick() if args.quick else Sizes()
    engines = [e for e, name in ((SQLITE, "sqlite"), (POSTGRES, "postgres")) if not args.engine or name in args.engine]
    groups = [g for g in GROUPS if not args.only or g in args.only]
    if POSTGRES in engines:
        try:
            import psycopg  # noqa: F401
        except ImportError:
            parser.error('PostgreSQL needs psycopg (pip install -e ".[postgres]"); or run with --engine sqlite')
        import postgres

        if postgres._load_pg_cluster().find_bin_dir() is None:
            parser.error("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found; "
                         "or run with --engine sqlite")

    def log(line: str) -> None:
        print(line, flush=True)

    tmp = tempfile.mkdtemp(prefix="reliable-flow-paths-", dir=args.tmp)
    started = time.perf_counter()
    load = Load()
    info = machine(tmp)
    server = None
    settings = None
    verified: list[tuple[str, int, int, int, int]] = []
    try:
        log("machine: " + "; ".join(f"{k} {v}" for k, v in info.items()))
        if POSTGRES in engines:
            import postgres

            server = postgres.Server()
            server.start()
            settings = server.settings()
            settings = {k: settings[k] for k in ("server_version", "fsync", "synchronous_commit",
                                                 "wal_sync_method", "shared_buffers") if k in settings}
            verified = verify_pg_counting(server.cluster.dsn(postgres.DATABASE), tmp)
            log("round-trip counting checked: " + "; ".join(f"{v[0]}: {v[3]}" for v in verified))
        env = Env(tmp, server)
        counts: dict[Key, Counts] = {}
        timed = Timed()
        for group in groups:
            keys = sides_of(group, engines)
            log(f"{group}: counting {', '.join(' '.join(k) for k in keys)}")
            counts.update(count_group(group, keys, env, sizes))
            for key in keys:
                c = counts[key]
                log(f"  {' '.join(key)}: {c.per_event(c.total):.2f} statements/event"
                    + ("" if c.round_trips is None else f", {c.per_event(c.round_trips):.2f} round trips/event"))
            for r in range(rounds):
                time_group(group, keys, env, sizes, r, timed)
                load.sample()
                log(f"  round {r + 1}/{rounds}: us/event (client CPU) " + ", ".join(
                    f"{k[0][:2]} {k[1]} {k[2]} {timed.samples[k][-1].us_per_event:.0f} "
                    f"({timed.samples[k][-1].cpu_us_per_event:.0f})" for k in keys))
        report = Report(engines, counts, timed, rounds, sizes, verified)
        load.sample()
        elapsed = time.perf_counter() - started
        log("")
        log(report.console())
        log(f"total {elapsed:.0f} s")
        if args.write_results:
            with open(RESULTS, "w", encoding="utf-8") as f:
                f.write(markdown(report, info, settings, load, elapsed,
                                 argv if argv is not None else sys.argv[1:], args.quick))
            log(f"wrote {RESULTS}")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
