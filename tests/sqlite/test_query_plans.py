"""The hot queries use an index, so their cost does not grow with history.

Files with a few thousand events (mostly delivered and applied, a few still
open, one flow waiting at a gap) are built once through the public API, in
two versions: as the library leaves them (no statistics) and after
``ANALYZE``.  Then:

* ``EXPLAIN QUERY PLAN`` of each named hot query (the library's own SQL
  text: ``relay._NEXT_DUE``, ``consumer.NEXT_ROW`` (also the gap probe),
  ``consumer.OPEN_FLOWS``, and the id / flow lookups) must search an index
  on the right columns, never scan a table;
* every statement the hot calls really run (captured with a trace callback),
  the batched ones' set-based statements included, must be free of full
  scans;
* each hot call, counted in SQLite VM steps, must cost about the same on the
  big files as on tiny ones.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import pytest

from reliable_flow import Consumer, Producer, relay, relay_batch
from reliable_flow._core.effects import with_waits
from reliable_flow._core.operate import why_waiting
from reliable_flow._store.sqlite.inbox_sql import NEXT_ROW, SqliteInboxSql
from reliable_flow._store.sqlite.outbox_sql import SqliteOutboxSql
from reliable_flow._tools.attention import attention_items
from reliable_flow.reservation import RESERVATION
from reliable_flow.statuses import EffectState
from support import advance_step, envelope

BIG, SMALL = 1000, 3  # flows of three events each
# Tables whose size is the number of consumer files, not the amount of history.
SMALL_BY_DESIGN = {"consumer", "meta"}


def build(directory: Path, flows: int, analyze: bool) -> Path:
    """History: ``flows`` flows released, delivered and applied; then open work:
    N0..N19 committed, N0..N9 delivered but not applied, flow G waiting at a gap."""
    directory.mkdir()
    with Producer(directory / "producer.db", RESERVATION) as p, Consumer(directory / "consumer.db", RESERVATION) as c:
        with p.batch() as b:
            for f in range(flows):
                for s in (1, 2, 3):
                    advance_step(b, f"F{f}-{s}", f"F{f}", s)
        while relay_batch(p, c, 1000).results:
            pass
        c.process_all(batch_size=1000)
        with p.batch() as b:
            for f in range(20):
                b.advance(f"N{f}-1", f"N{f}", expected_seq=0, kind="reserved", payload={"amount": 3})
        assert len(relay_batch(p, c, 10).results) == 10
        assert c.receive(envelope("G2", "G", 2)).status == "accepted"
        if analyze:
            p._store._db.conn.execute("ANALYZE")
            c._store._db.conn.execute("ANALYZE")
    return directory


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int, bool], Path]:
    cache: dict[tuple[int, bool], Path] = {}

    def get(flows: int, analyze: bool) -> Path:
        key = (flows, analyze)
        if key not in cache:
            cache[key] = build(tmp_path_factory.mktemp("plans") / f"f{flows}-a{int(analyze)}", flows, analyze)
        return cache[key]

    return get


@contextmanager
def opened(source: Path, target: Path) -> Iterator[tuple[Producer, Consumer]]:
    """Open private copies of built files, so a test may write to them."""
    target.mkdir()
    for name in ("producer.db", "consumer.db"):
        shutil.copy(source / name, target / name)
    with Producer(target / "producer.db", RESERVATION) as p, Consumer(target / "consumer.db", RESERVATION) as c:
        yield p, c


def plan(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...] = ()) -> list[str]:
    return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params)]


def partial_indexes(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND sql LIKE '% WHERE %'")}


_KEYWORDS = {"WHERE", "JOIN", "ON", "CROSS", "INNER", "LEFT", "INDEXED", "ORDER", "GROUP", "LIMIT", "NATURAL",
             "USING", "SET", "VALUES", "SELECT", "AS"}


def aliases(sql: str) -> dict[str, str]:
    """Alias -> table for the tables a statement names (EXPLAIN QUERY PLAN prints aliases)."""
    found = {}
    for table, alias in re.findall(r"\b(?:FROM|JOIN|UPDATE|INTO)\s+(\w+)(?:\s+(?:AS\s+)?(\w+))?", sql, flags=re.IGNORECASE):
        found[table] = table
        if alias and alias.upper() not in _KEYWORDS:
            found[alias] = table
    return found


def full_scans(conn: sqlite3.Connection, details: list[str], sql: str = "") -> list[str]:
    """Plan lines that read a whole table or a whole full index (or build an automatic index)."""
    partial = partial_indexes(conn)
    tables = aliases(sql)
    # Rows the statement makes itself (a VALUES list, a subquery run as a
    # co-routine): scanning them reads no table.
    own = {line.split()[1] for line in details if line.startswith(("CO-ROUTINE ", "MATERIALIZE "))}
    bad = []
    for line in details:
        if "AUTOMATIC" in line:
            bad.append(line)
            continue
        if not line.startswith("SCAN ") or line.startswith("SCAN (subquery") or re.match(r"SCAN (\d+ )?CONSTANT ROW", line):
            continue
        words = line.split()
        if words[1] in own or tables.get(words[1], words[1]) in SMALL_BY_DESIGN:
            continue
        index = words[words.index("INDEX") + 1] if "INDEX" in words else None
        if index not in partial:  # a partial index holds only the open work
            bad.append(line)
    return bad


# -- the named hot queries -------------------------------------------------------------------

HOT_QUERIES = [
    # (id, side, sql, params, what the plan line must say)
    ("relay._NEXT_DUE", "producer", SqliteOutboxSql.NEXT_DUE, ("default", 1e300, 1), "USING INDEX delivery_due (consumer=?"),
    ("outbox_by_event_id", "producer", "SELECT seq, body FROM outbox WHERE event_id = ?", ("F7-1",), "(event_id=?)"),
    ("outbox_body_by_pos", "producer", "SELECT body FROM outbox WHERE pos = ?", (7,), "USING INTEGER PRIMARY KEY (rowid=?)"),
    ("flow_by_id", "producer", "SELECT seq, state, data FROM flow WHERE flow_id = ?", ("F7",), "(flow_id=?)"),
    ("delivery_mark", "producer",
     "UPDATE delivery SET state = 'accepted', last_status = ? WHERE consumer = ? AND pos = ?",
     ("accepted", "default", 7), "USING PRIMARY KEY (consumer=? AND pos=?)"),
    ("consumer.NEXT_ROW", "consumer", NEXT_ROW, ("F7", 2), "(flow_id=? AND seq>?)"),
    ("consumer.OPEN_FLOWS", "consumer", SqliteInboxSql.OPEN_FLOWS, (), "INDEX inbox_open"),
    ("consumer.OLDEST_PENDING", "consumer", SqliteInboxSql.OLDEST_PENDING, ("F7",), "INDEX inbox_open (flow_id=?)"),
    ("consumer.NEWEST_WAITING", "consumer", SqliteInboxSql.NEWEST_WAITING, ("F7",), "INDEX inbox_open (flow_id=?)"),
    ("inbox_by_event_id", "consumer", "SELECT body FROM inbox WHERE event_id = ?", ("F7-1",), "(event_id=?)"),
    ("inbox_by_flow_and_seq", "consumer", "SELECT event_id FROM inbox WHERE flow_id = ? AND seq = ?", ("F7", 1),
     "(flow_id=? AND seq=?)"),
    ("inbox_mark_applied", "consumer", "UPDATE inbox SET state = 'applied', reason = NULL WHERE event_id = ?",
     ("F7-1",), "(event_id=?)"),
    ("projection_by_flow", "consumer", "SELECT state, last_seq, data FROM projection WHERE flow_id = ?", ("F7",),
     "(flow_id=?)"),
]

def _hot_query_params() -> list[Any]:
    return [
        pytest.param(analyze, *case[1:], id=f"{case[0]}-{'analyzed' if analyze else 'no-stats'}")
        for analyze in (False, True) for case in HOT_QUERIES
    ]


@pytest.mark.parametrize("analyze, side, sql, params, expected", _hot_query_params())
def test_hot_query_searches_an_index(
    built: Callable[[int, bool], Path], analyze: bool, side: str, sql: str, params: tuple[Any, ...], expected: str
) -> None:
    path = built(BIG, analyze) / f"{side}.db"
    with closing(sqlite3.connect(path)) as conn:
        details = plan(conn, sql, params)
        assert full_scans(conn, details, sql) == [], details
    uses = [d for d in details if "USING" in d and ("INDEX" in d or "PRIMARY KEY" in d)]
    assert uses, f"no index in the plan: {details}"
    assert any(expected in d for d in uses), f"expected {expected!r} in {details}"


def test_the_plan_checker_sees_a_full_scan(built: Callable[[int, bool], Path]) -> None:
    """Control: the same checks flag a query that must read the whole table."""
    with closing(sqlite3.connect(built(BIG, False) / "consumer.db")) as conn:
        details = plan(conn, "SELECT body FROM inbox i WHERE i.body LIKE ?", ("%x%",))
        assert full_scans(conn, details, "SELECT body FROM inbox i WHERE i.body LIKE ?") == details == ["SCAN i"]
        # A scan of a *full* index is as bad as a table scan.
        details = plan(conn, "SELECT DISTINCT flow_id FROM inbox ORDER BY flow_id")
        assert full_scans(conn, details, "SELECT DISTINCT flow_id FROM inbox ORDER BY flow_id") == details
        # But the consumer table is small by design, aliased or not.
        assert full_scans(conn, ["SCAN c"], "SELECT name FROM consumer c") == []


# -- every statement the hot calls run --------------------------------------------------------


def _advance_batch(p: Producer) -> Any:
    """Three new flows in one batch: its delivery rows are written by one set-based statement."""
    with p.batch() as b:
        for f in ("Z", "Y", "X"):
            b.advance(f"{f}1", f, expected_seq=0, kind="reserved", payload={"amount": 3})
    return b.results


HOT_CALLS: dict[str, Callable[[Producer, Consumer], Any]] = {
    "advance_new": lambda p, c: p.advance("Z1", "Z", expected_seq=0, kind="reserved", payload={"amount": 3}),
    "advance_repeat": lambda p, c: p.advance("F1-1", "F1", expected_seq=0, kind="reserved", payload={"amount": 3}),
    "advance_stale": lambda p, c: p.advance("X9", "F1", expected_seq=0, kind="reserved", payload={"amount": 3}),
    "relay_next": lambda p, c: relay(p, c),
    "relay_by_event_id": lambda p, c: relay(p, c, event_id="F1-2"),
    "receive_new": lambda p, c: c.receive(envelope("Z1", "Z", 1)),
    "receive_duplicate": lambda p, c: c.receive(envelope("F1-1", "F1", 1)),
    "apply_next": lambda p, c: c.apply_next("N0"),
    "apply_next_gap": lambda p, c: c.apply_next("G"),
    "apply_next_idle": lambda p, c: c.apply_next("F1"),
    "drain": lambda p, c: c.drain("N1"),
    "process_all": lambda p, c: c.process_all(),
    "advance_batch": lambda p, c: _advance_batch(p),
    "relay_batch": lambda p, c: relay_batch(p, c, 5),
    "receive_many": lambda p, c: c.receive_many(
        [envelope("Z1", "Z", 1), envelope("Y1", "Y", 1), envelope("F1-1", "F1", 1)]),
    "producer_outbox_of_a_flow": lambda p, c: p.outbox("F1"),
    "producer_flow": lambda p, c: p.flow("F1"),
    "consumer_reads_of_a_flow": lambda p, c: (c.projection("F1"), c.inbox("F1"), c.applied("F1")),
}

def _calls_params() -> list[Any]:
    return [
        pytest.param(analyze, name, id=f"{name}-{'analyzed' if analyze else 'no-stats'}")
        for analyze in (False, True) for name in HOT_CALLS
    ]


@contextmanager
def traced(*conns: sqlite3.Connection) -> Iterator[list[tuple[int, str]]]:
    seen: list[tuple[int, str]] = []
    for i, conn in enumerate(conns):
        conn.set_trace_callback(lambda sql, i=i: seen.append((i, sql)))
    try:
        yield seen
    finally:
        for conn in conns:
            conn.set_trace_callback(None)


@pytest.mark.parametrize("analyze, name", _calls_params())
def test_every_statement_of_a_hot_call_avoids_full_scans(
    built: Callable[[int, bool], Path], tmp_path: Path, analyze: bool, name: str
) -> None:
    with opened(built(BIG, analyze), tmp_path / "files") as (p, c):
        conns = (p._store._db.conn, c._store._db.conn)
        with traced(*conns) as seen:
            HOT_CALLS[name](p, c)
        statements = [(i, sql) for i, sql in seen
                      if sql.split(None, 1)[0].upper() in ("SELECT", "UPDATE", "DELETE", "INSERT", "WITH")]
        assert statements, f"{name} ran no query at all"
        problems = {}
        for i, sql in statements:
            # The trace shows bound values inline; SQLite prints infinity as Inf.
            sql = re.sub(r"\bInf\b", "9e999", sql)
            details = plan(conns[i], sql)
            bad = full_scans(conns[i], details, sql)
            if bad:
                problems[sql] = details
        assert problems == {}


# -- the console's reads (issue 31, item 5) -------------------------------------------------------

NOW = 2e9  # far after the files were built: every waiting row is old enough to be a candidate

# Reads whose scan stops after a LIMIT, which the plan checker cannot tell
# from a full one: the counts that stop at a cap (held to the VM-step bound
# below instead, with a cap far below the big files' size) and the first
# effects page without a filter (rowid order: the walk stops after the page).
STOPPED_BY_LIMIT = (
    re.compile(r"SELECT count\(\*\) FROM \(SELECT 1 FROM (outbox|flow) LIMIT 10\) t"),
    re.compile(r"SELECT [\w, ]+ FROM effect_outbox\s+ORDER BY id LIMIT 11"),
)


def _effect_pages(c: Any) -> Any:
    after = "default:F1-1:notify"
    return [c.effect_list(state=state, name=name, after=a, flow_id=flow, limit=11)
            for state in (None, EffectState.DEAD) for name in (None, "notify") for a in (None, after)
            for flow in (None, "F1") if flow is None or (state is None and name is None)]


CONSOLE_READS: dict[str, Callable[[Any, Any], Any]] = {
    "overview": lambda p, c: (attention_items(p, c, NOW, 300.0, 10), p.pending_summary("default", NOW, 10),
                              p.sizes(10), c.waiting_summary(10), c.effect_counts(cap=10), c.applies_recorded()),
    "effects_pages": lambda p, c: _effect_pages(c),
    "flows_by_correlation": lambda p, c: c.flows_by_correlation("order-7", 11),
    "flow_page": lambda p, c: (p.outbox("F1"), why_waiting(c, "F1"), with_waits(c, c.effect_list(flow_id="F1"))),
    "set_aside": lambda p, c: p.set_aside(11),
}


def _console(p: Producer, c: Consumer, name: str) -> Any:
    with p._store.read() as p_reads, c._store.read() as c_reads:
        return CONSOLE_READS[name](p_reads, c_reads)


@pytest.mark.parametrize("analyze", [False, True], ids=["no-stats", "analyzed"])
@pytest.mark.parametrize("name", list(CONSOLE_READS))
def test_every_statement_of_a_console_read_avoids_full_scans(
    built: Callable[[int, bool], Path], tmp_path: Path, analyze: bool, name: str
) -> None:
    with opened(built(BIG, analyze), tmp_path / "files") as (p, c):
        conns = (p._store._db.conn, c._store._db.conn)
        with traced(*conns) as seen:
            _console(p, c, name)
        statements = [(i, sql) for i, sql in seen if sql.split(None, 1)[0].upper() in ("SELECT", "WITH")]
        assert statements, f"{name} ran no query at all"
        problems = {sql: details for i, sql in statements
                    if not any(r.fullmatch(sql) for r in STOPPED_BY_LIMIT)
                    and (details := plan(conns[i], sql)) and full_scans(conns[i], details, sql)}
        assert problems == {}


@pytest.mark.parametrize("name", list(CONSOLE_READS))
def test_a_console_read_costs_about_the_same_with_3000_events_of_history_as_with_9(
    built: Callable[[int, bool], Path], tmp_path: Path, name: str
) -> None:
    costs = []
    for flows in (SMALL, BIG):
        with opened(built(flows, False), tmp_path / f"f{flows}") as (p, c):
            costs.append(vm_steps((p._store._db.conn, c._store._db.conn), lambda: _console(p, c, name)))
    small, big = costs
    assert big <= 2 * small + 200, f"{name}: {small} VM steps with {SMALL * 3} events, {big} with {BIG * 3}"


# -- cost in VM steps: big history vs tiny --------------------------------------------------------


def vm_steps(conns: tuple[sqlite3.Connection, ...], call: Callable[[], Any]) -> int:
    count = [0]

    def tick() -> int:
        count[0] += 1
        return 0

    for conn in conns:
        conn.set_progress_handler(tick, 1)
    try:
        call()
    finally:
        for conn in conns:
            conn.set_progress_handler(None, 1)
    return count[0]


@pytest.mark.parametrize("analyze, name", _calls_params())
def test_a_hot_call_costs_about_the_same_with_3000_events_of_history_as_with_9(
    built: Callable[[int, bool], Path], tmp_path: Path, analyze: bool, name: str
) -> None:
    costs = []
    for flows in (SMALL, BIG):
        with opened(built(flows, analyze), tmp_path / f"f{flows}") as (p, c):
            costs.append(vm_steps((p._store._db.conn, c._store._db.conn), lambda: HOT_CALLS[name](p, c)))
    small, big = costs
    # B-trees get one or two levels deeper; anything proportional to history is 10-100x more.
    assert big <= 2 * small + 200, f"{name}: {small} VM steps with {SMALL * 3} events, {big} with {BIG * 3}"


def test_the_cost_check_sees_a_query_proportional_to_history(
    built: Callable[[int, bool], Path], tmp_path: Path
) -> None:
    """Control: counting all inbox rows is caught by the same bound."""
    costs = []
    for flows in (SMALL, BIG):
        with opened(built(flows, False), tmp_path / f"f{flows}") as (_, c):
            conn = c._store._db.conn
            query = "SELECT count(*) FROM inbox WHERE seq > 0"
            costs.append(vm_steps((conn,), lambda conn=conn, query=query: conn.execute(query).fetchone()))
    small, big = costs
    assert big > 2 * small + 200
