"""The batch APIs: ``Producer.batch()``, ``Consumer.receive_many``,
``relay_batch`` and ``drain`` / ``process_all`` with ``batch_size``.

The contract under test: one transaction per batch, and exactly the same
statuses, order and stop points per event as the single-event calls.

Every test runs on both engines (the ``engine`` fixture of conftest.py);
what is seen only through the store's own ``sqlite3`` connection (traced
statements, TEMP triggers, ``setlimit``) is in tests/sqlite/test_batch_sqlite.py.

* A differential test runs one seeded random sequence of operations through
  the single-event calls (on SQLite) and through the batch calls (batch sizes
  1, 3, 100, on either engine) and compares every answer and both stores at
  the end.
* Atomicity: an exception or an injected SQL failure (a trigger) inside a
  batch leaves nothing of the batch.
* Crash points fire inside batches (real child processes, ``os._exit(73)``):
  cut in the middle of a batch's transaction nothing of it is on disk, right
  after its commit all of it is, and recovery ends with one effect per event.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import sqlite3
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from children.batch_child import ADVANCE_BATCH, ADVANCE_BATCH_PRE, TICKER
from engine_reads import (
    allow_inserts,
    integrity_error,
    is_pg,
    new_location,
    reject_inserts,
    snapshot_of,
)
from reliable_flow import (
    Consumer,
    DeliveryPolicy,
    Producer,
    ReliableFlowError,
    relay,
    relay_batch,
    snapshot,
)
from reliable_flow.crash import CRASH_EXIT_CODE, ENV_VAR
from reliable_flow.errors import InvalidEnvelope
from reliable_flow.records import ApplyResult, DrainResult, InboxEntry, RelayResult
from reliable_flow.reservation import RESERVATION
from support import (
    CHILDREN,
    KINDS,
    advance_step,
    child_env,
    envelope,
    outbox_entry,
    relay_until_idle,
    run_script,
)

BATCH_CHILD = CHILDREN / "batch_child.py"
try:  # what a refused write raises: the engine's own error (psycopg is the optional extra)
    import psycopg

    DB_ERRORS: tuple[type[Exception], ...] = (sqlite3.Error, psycopg.Error)
except ImportError:  # pragma: no cover - only without the postgres extra
    DB_ERRORS = (sqlite3.Error,)
SEED = int(os.environ.get("RELIABLE_FLOW_BATCH_SEED", "20240611"))


# -- helpers ------------------------------------------------------------------------


def tick(flow_id: str, seq: int, *, kind: str = "running", schema: int = 1,
         payload: dict[str, Any] | None = None) -> dict[str, Any]:
    """A TICKER envelope with event id ``<flow><seq>``."""
    return {
        "event_id": f"{flow_id}{seq}", "flow_id": flow_id, "seq": seq, "kind": kind,
        "schema": schema, "payload": payload if payload is not None else {"n": 1},
    }


def commit_steps(producer: Producer, *events: tuple[str, str, int]) -> None:
    for event_id, flow_id, seq in events:
        r = advance_step(producer, event_id, flow_id, seq)
        assert (r.status, r.seq) == ("committed", seq), r


@contextmanager
def traced(conn: sqlite3.Connection) -> Iterator[list[str]]:
    """Every SQL statement the connection runs inside the block, in order."""
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    try:
        yield seen
    finally:
        conn.set_trace_callback(None)


@contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Turn a hang (e.g. a batch loop that never advances) into a failure."""

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def transactions(statements: list[str]) -> list[list[str]]:
    """The statements of each BEGIN IMMEDIATE ... COMMIT/ROLLBACK, in order."""
    out: list[list[str]] = []
    current: list[str] | None = None
    for s in statements:
        word = s.strip().upper()
        if word.startswith("BEGIN"):
            assert current is None, "nested BEGIN"
            current = []
        elif word in ("COMMIT", "ROLLBACK"):
            assert current is not None, f"{word} outside a transaction"
            out.append(current + [word])
            current = None
        elif current is not None:
            current.append(s)
    assert current is None, "transaction left open"
    return out


def count(statements: list[str], prefix: str) -> int:
    return sum(1 for s in statements if s.strip().upper().startswith(prefix.upper()))


def pair(new_store: Callable[[str], str], stack: ExitStack, name: str = "",
         **consumer_kw: Any) -> tuple[Producer, Consumer]:
    """A producer and a consumer on fresh stores of ``new_store`` (the fixture: the test's engine)."""
    producer = stack.enter_context(Producer(new_store(f"producer{name}"), RESERVATION))
    consumer = stack.enter_context(Consumer(new_store(f"consumer{name}"), RESERVATION, **consumer_kw))
    return producer, consumer


def relay_all_batched(producer: Producer, consumer: Consumer, limit: int,
                      policy: DeliveryPolicy | None = None) -> list[RelayResult]:
    out: list[RelayResult] = []
    for _ in range(10_000):
        r = relay_batch(producer, consumer, limit=limit, policy=policy)
        assert len(r.results) <= limit
        assert r.counts == dict(Counter(x.status.value for x in r.results))
        assert r.refused == 0
        if r.idle:
            assert (r.results, r.counts) == ((), {})
            return out
        out.extend(r.results)
    raise AssertionError("relay_batch never went idle")


def flow_invariant(producer: Producer) -> None:
    """Every flow row is backed by exactly its outbox events 1..seq."""
    for flow_id in producer.flows():
        flow = producer.flow(flow_id)
        assert flow is not None
        seqs = [e.seq for e in producer.outbox(flow_id)]
        assert seqs == list(range(1, flow["seq"] + 1)), (flow_id, flow, seqs)


# =====================================================================================
# 1. Differential: the same random operations, single calls vs. batches
# =====================================================================================


@dataclass(frozen=True)
class Chunk:
    advances: tuple[tuple[str, dict[str, Any]], ...]  # (intended status, advance kwargs)
    receives: tuple[tuple[str, str], ...]             # (deliver | forge_id | forge_seq, event_id)
    relay: int                                        # how many events to relay afterwards
    apply_limit: int                                  # process_all(limit=...) afterwards


def make_plan(seed: int, n_advances: int = 200, slots: int = 10) -> list[Chunk]:
    """A seeded random workload of ``n_advances`` advances over ``slots`` flow slots.

    A small model of the producer says what each advance is meant to be
    (committed, existing, conflict, stale, invalid_transition,
    invalid_payload); the reference run checks the model, the batch runs are
    checked against the reference.  A slot whose flow was released moves on
    to a fresh flow id, so most advances can commit.
    """
    rng = random.Random(seed)
    ids = itertools.count(1)
    state: list[dict[str, Any]] = [{"slot": i, "gen": 0, "flow": f"F{i}", "seq": 0, "amount": 0}
                                   for i in range(slots)]
    committed: list[dict[str, Any]] = []
    chunks: list[Chunk] = []
    made = 0

    def new_id() -> str:
        return f"e{next(ids):04d}"

    def payload(schema: int, amount: object) -> dict[str, Any]:
        return {"units": amount} if schema == 2 else {"amount": amount}

    while made < n_advances:
        size = min(rng.randint(1, 12), n_advances - made)
        made += size
        advances: list[tuple[str, dict[str, Any]]] = []
        fresh: list[tuple[str, int]] = []
        for _ in range(size):
            s = rng.choice(state)
            if s["seq"] == 3 and rng.random() < 0.7:
                s.update(gen=s["gen"] + 1, flow=f"F{s['slot']}.{s['gen'] + 1}", seq=0, amount=0)
            seq, flow = s["seq"], s["flow"]
            roll = rng.random()
            if committed and roll < 0.12:
                advances.append(("existing", dict(rng.choice(committed))))
                continue
            if committed and roll < 0.22:
                base = dict(rng.choice(committed))
                how = rng.choice(["payload", "kind", "expected_seq", "schema", "meta"])
                if how == "payload":
                    key, value = next(iter(base["payload"].items()))
                    base["payload"] = {key: value + 1 if value < 1000 else value - 1}
                elif how == "kind":
                    base["kind"] = rng.choice([k for k in KINDS if k != base["kind"]])
                elif how == "expected_seq":
                    base["expected_seq"] += 1
                elif how == "schema":
                    value = next(iter(base["payload"].values()))
                    base["schema"] = 3 - base["schema"]
                    base["payload"] = payload(base["schema"], value)
                else:
                    base["meta"] = {"correlation_id": "changed"} if not base.get("meta") else None
                advances.append(("conflict", base))
                continue
            amount = s["amount"] or rng.randint(1, 1000)
            legal = KINDS[seq] if seq < 3 else None
            if roll < 0.32:
                wrong = rng.choice([seq + 1, seq + 2] + ([seq - 1] if seq else []))
                call = {"event_id": new_id(), "flow_id": flow, "expected_seq": wrong,
                        "kind": legal or "reserved", "payload": {"amount": amount}, "schema": 1}
                advances.append(("stale", call))
                continue
            if roll < 0.42 or legal is None:
                kind = rng.choice([k for k in KINDS + ("cancelled",) if k != legal])
                call = {"event_id": new_id(), "flow_id": flow, "expected_seq": seq, "kind": kind,
                        "payload": {"amount": amount}, "schema": 1}
                advances.append(("invalid_transition", call))
                continue
            if roll < 0.55:
                bad: list[tuple[int, dict[str, Any]]] = [
                    (1, {"amount": 0}), (1, {"amount": amount, "note": "x"}), (1, {"qty": amount}),
                    (3, {"amount": amount}), (2, {"amount": amount}), (1, {"amount": True}),
                    (1, {"amount": 1_000_001}), (2, {"units": 0}),
                ]
                if seq > 0:
                    bad.append((1, {"amount": amount + 1}))
                schema, body = rng.choice(bad)
                call = {"event_id": new_id(), "flow_id": flow, "expected_seq": seq, "kind": legal,
                        "payload": body, "schema": schema}
                advances.append(("invalid_payload", call))
                continue
            schema = 2 if rng.random() < 0.1 else 1
            call = {"event_id": new_id(), "flow_id": flow, "expected_seq": seq, "kind": legal,
                    "payload": payload(schema, amount), "schema": schema}
            if rng.random() < 0.2:
                call["meta"] = {"correlation_id": f"c-{call['event_id']}"}
            advances.append(("committed", call))
            committed.append(call)
            fresh.append((call["event_id"], seq + 1))
            s.update(seq=seq + 1, amount=amount)
        receives: list[tuple[str, str]] = []
        for event_id, event_seq in fresh:
            roll = rng.random()
            early = 0.4 if event_seq > 1 else 0.1  # a later step first: a gap until relay
            if roll < early:
                receives.append(("deliver", event_id))
            elif roll < early + 0.06:
                receives.append(("forge_id", event_id))
            elif roll < early + 0.12:
                receives.append(("forge_seq", event_id))
        chunks.append(Chunk(tuple(advances), tuple(receives), rng.randint(0, len(fresh) + 2),
                            rng.choice([1, 2, 1000])))
    return chunks


def resolve(producer: Producer, receives: tuple[tuple[str, str], ...]) -> list[dict[str, Any]]:
    """The envelopes of a chunk's direct receives, built from the producer's file."""
    out = []
    for how, event_id in receives:
        body = producer.event(event_id)
        assert body is not None, event_id
        if how == "forge_id":
            key, value = next(iter(body["payload"].items()))
            body = {**body, "payload": {key: value + 1}}
        elif how == "forge_seq":
            body = {**body, "event_id": f"X-{event_id}"}
        out.append(body)
    return out


@dataclass
class Run:
    log: list[tuple[Any, ...]]
    snapshot: dict[str, Any]


def run_plan(new_store: Callable[[str], str], plan: list[Chunk], batch_size: int | None) -> Run:
    """Run the plan with single calls (``batch_size`` None) or with the batch APIs,
    on two fresh stores of ``new_store``."""
    log: list[tuple[Any, ...]] = []
    bs = batch_size or 1
    p_at, c_at = new_store("p"), new_store("c")
    with ExitStack() as stack:
        producer = stack.enter_context(Producer(p_at, RESERVATION))
        consumer = stack.enter_context(Consumer(c_at, RESERVATION))

        def deliver(k: int) -> list[RelayResult]:
            if batch_size is None:
                out = []
                for _ in range(k):
                    r = relay(producer, consumer)
                    if r.status == "idle":
                        break
                    out.append(r)
                return out
            out = []
            while len(out) < k:
                want = min(bs, k - len(out))
                rb = relay_batch(producer, consumer, limit=want)
                assert rb.counts == dict(Counter(x.status.value for x in rb.results))
                assert rb.refused == 0 and rb.idle == (not rb.results)
                out.extend(rb.results)
                if len(rb.results) < want:
                    break
            return out

        def apply(limit: int) -> dict[str, DrainResult]:
            if batch_size is None:
                return consumer.process_all(limit=limit)
            return consumer.process_all(limit=limit, batch_size=bs)

        for n, chunk in enumerate(plan):
            calls = [call for _, call in chunk.advances]
            if batch_size is None:
                advanced = [producer.advance(**call) for call in calls]
            else:
                advanced = []
                for start in range(0, len(calls), bs):
                    with producer.batch() as b:
                        returned = [b.advance(**call) for call in calls[start:start + bs]]
                    assert returned == b.results
                    assert b.committed == sum(1 for r in returned if r.status == "committed")
                    advanced.extend(returned)
            envelopes = resolve(producer, chunk.receives)
            if batch_size is None:
                received = [consumer.receive(e) for e in envelopes]
            else:
                received = consumer.receive_many(envelopes)
            log.append((n, "advance", advanced))
            log.append((n, "receive", received))
            log.append((n, "relay", deliver(chunk.relay)))
            log.append((n, "apply", apply(chunk.apply_limit)))
        # The end: a consumer that decodes schema 2 too, everything delivered and applied.
        consumer.close()
        consumer = stack.enter_context(Consumer(c_at, RESERVATION, schemas={1, 2}))
        log.append(("end", "relay", deliver(10_000)))
        log.append(("end", "apply", apply(1000)))
        log.append(("end", "relay-again", deliver(10_000)))
    return Run(log, snapshot_of(p_at, c_at))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Chunk], Run]:
    """The plan run with single calls, on SQLite: the batch runs of either engine must match it."""
    plan = make_plan(SEED)
    tmp = tmp_path_factory.mktemp("single")
    return plan, run_plan(lambda label: new_location("sqlite", tmp, label), plan, None)


def test_the_random_workload_covers_every_status_and_matches_its_model(
    reference: tuple[list[Chunk], Run],
) -> None:
    print(f"seed={SEED} (set RELIABLE_FLOW_BATCH_SEED to replay another)")
    plan, run = reference
    assert sum(len(c.advances) for c in plan) == 200
    advanced = [r for n, what, rs in run.log if what == "advance" for r in rs]
    intended = [intent for c in plan for intent, _ in c.advances]
    assert [str(r.status) for r in advanced] == intended, f"seed={SEED}"
    assert set(intended) == {"committed", "existing", "conflict", "stale", "invalid_transition",
                             "invalid_payload"}, f"seed={SEED}"
    assert any(c.get("schema") == 2 for ch in plan for i, c in ch.advances if i == "committed")
    relayed = Counter(str(r.status) for n, what, rs in run.log if what.startswith("relay") for r in rs)
    assert {"accepted", "duplicate", "id_conflict", "sequence_conflict"} <= set(relayed), relayed
    stops = Counter(str(d.stop) for n, what, ds in run.log if what == "apply" for d in ds.values())
    assert {"gap", "blocked", "idle", "limit"} <= set(stops), stops
    reasons = {str(d.last.reason) for n, what, ds in run.log if what == "apply"
               for d in ds.values() if d.stop == "blocked" and d.last is not None}
    assert "unsupported_schema" in reasons, reasons
    # The end state obeys the invariant: applied events are a gap-free prefix,
    # one effect per applied event, every committed flow backed by its events.
    consumer_side = run.snapshot["consumer"]
    for flow_id, rows in consumer_side["inbox"].items():
        applied = [r["seq"] for r in rows if r["state"] == "applied"]
        assert applied == list(range(1, len(applied) + 1)), flow_id
        effects = consumer_side["effects"][flow_id]
        assert [e["seq"] for e in effects] == applied
        assert len({e["event_id"] for e in effects}) == len(effects)
    for flow_id, flow in run.snapshot["producer"]["flows"].items():
        assert [e["seq"] for e in run.snapshot["producer"]["outbox"][flow_id]] == list(range(1, flow["seq"] + 1))
    # relay-again ran after everything: set-aside events are not retried.
    assert run.log[-1] == ("end", "relay-again", [])


@pytest.mark.parametrize("batch_size", [1, 3, 100])
def test_batches_answer_and_store_exactly_like_single_calls(
    reference: tuple[list[Chunk], Run], new_store: Callable[[str], str], batch_size: int,
) -> None:
    print(f"seed={SEED} batch_size={batch_size}")
    plan, expected = reference
    got = run_plan(new_store, plan, batch_size)
    assert len(got.log) == len(expected.log)
    for want, have in zip(expected.log, got.log):
        # Per-event statuses, seqs, reasons, event ids; drain results incl. the last apply.
        assert have == want, f"seed={SEED} batch_size={batch_size} chunk {want[0]} {want[1]}"
    assert got.snapshot == expected.snapshot, f"seed={SEED} batch_size={batch_size}"


# =====================================================================================
# 2. Producer.batch()
# =====================================================================================


def test_a_batch_commits_advances_across_flows_and_sees_its_own_earlier_advances(producer: Producer) -> None:
    with producer.batch() as b:
        results = [
            advance_step(b, "A1", "A", 1),
            advance_step(b, "B1", "B", 1, amount=5),
            advance_step(b, "A2", "A", 2),          # sees A1 of the same batch
            advance_step(b, "A3", "A", 3),
        ]
        assert [r.status for r in results] == ["committed"] * 4
        # Inside the block, single-call reads on the same connection see it too.
        assert producer.flow("A") == {"state": "released", "seq": 3, "amount": 3}
    assert [(r.event_id, r.flow_id, r.seq, r.reason) for r in results] == [
        ("A1", "A", 1, None), ("B1", "B", 1, None), ("A2", "A", 2, None), ("A3", "A", 3, None)]
    assert b.results == results and b.committed == 4
    assert producer.flow("A") == {"state": "released", "seq": 3, "amount": 3}
    assert producer.flow("B") == {"state": "reserved", "seq": 1, "amount": 5}
    assert [(e.event_id, e.seq) for e in producer.outbox()] == [("A1", 1), ("B1", 1), ("A2", 2), ("A3", 3)]
    flow_invariant(producer)


def test_every_status_inside_one_batch_is_the_single_call_status(new_store: Any) -> None:
    calls: list[dict[str, Any]] = [
        {"event_id": "A1", "flow_id": "A", "expected_seq": 0, "kind": "reserved", "payload": {"amount": 3}},
        {"event_id": "A1", "flow_id": "A", "expected_seq": 0, "kind": "reserved", "payload": {"amount": 3}},
        {"event_id": "A1", "flow_id": "A", "expected_seq": 0, "kind": "reserved", "payload": {"amount": 4}},
        {"event_id": "A1", "flow_id": "A", "expected_seq": 0, "kind": "reserved", "payload": {"units": 3}, "schema": 2},
        {"event_id": "A1b", "flow_id": "A", "expected_seq": 0, "kind": "reserved", "payload": {"amount": 3}},
        {"event_id": "A2x", "flow_id": "A", "expected_seq": 1, "kind": "released", "payload": {"amount": 3}},
        {"event_id": "A2y", "flow_id": "A", "expected_seq": 1, "kind": "confirmed", "payload": {"amount": 4}},
        {"event_id": "A2z", "flow_id": "A", "expected_seq": 1, "kind": "confirmed", "payload": {"amount": 3}, "schema": 7},
        {"event_id": "A2", "flow_id": "A", "expected_seq": 1, "kind": "confirmed", "payload": {"units": 3}, "schema": 2},
        {"event_id": "A1", "flow_id": "A", "expected_seq": 0, "kind": "reserved", "payload": {"amount": 3}},
        {"event_id": "B1", "flow_id": "B", "expected_seq": 0, "kind": "reserved", "payload": {"amount": 1},
             "meta": {"correlation_id": "c1"}},
        {"event_id": "B1", "flow_id": "B", "expected_seq": 0, "kind": "reserved", "payload": {"amount": 1}},
    ]
    with Producer(new_store("single"), RESERVATION) as single, \
            Producer(new_store("batch"), RESERVATION) as batched:
        want = [single.advance(**c) for c in calls]
        with batched.batch() as b:
            got = [b.advance(**c) for c in calls]
        assert got == want
        assert [str(r.status) for r in got] == [
            "committed", "existing", "conflict", "conflict", "stale", "invalid_transition",
            "invalid_payload", "invalid_payload", "committed", "existing", "committed", "conflict"]
        assert "payload" in (got[2].reason or "") and "schema" in (got[3].reason or "")
        assert [e.event_id for e in batched.outbox()] == ["A1", "A2", "B1"]
        assert [batched.event(e) for e in ("A1", "A2", "B1")] == [single.event(e) for e in ("A1", "A2", "B1")]
        assert batched.flow("A") == single.flow("A") == {"state": "confirmed", "seq": 2, "amount": 3}


def test_backlog_full_inside_a_batch_matches_single_calls(new_store: Any) -> None:
    with Producer(new_store("s"), RESERVATION, max_backlog=2) as single, \
            Producer(new_store("b"), RESERVATION, max_backlog=2) as batched:
        want = [advance_step(single, f"{f}1", f, 1) for f in "ABC"]
        with batched.batch() as b:
            got = [advance_step(b, f"{f}1", f, 1) for f in "ABC"]
        assert got == want
        assert [str(r.status) for r in got] == ["committed", "committed", "backlog_full"]
        assert batched.flow("C") is None


class Boom(Exception):
    pass


def test_an_exception_in_the_block_rolls_back_every_advance_of_the_batch(new_store: Any) -> None:
    with ExitStack() as stack:
        producer, consumer = pair(new_store, stack)
        commit_steps(producer, ("A1", "A", 1))
        before = snapshot(producer.location, consumer.location)
        with pytest.raises(Boom), producer.batch() as b:
            assert advance_step(b, "A2", "A", 2).status == "committed"
            assert advance_step(b, "B1", "B", 1).status == "committed"
            assert advance_step(b, "C1", "C", 1).status == "committed"
            raise Boom("after three advances")
        assert producer.store.in_transaction() is False
        assert snapshot(producer.location, consumer.location) == before
        assert producer.flows() == ["A"] and producer.flow("B") is None
        # The ids were never stored: the same advances commit now, one by one.
        assert [advance_step(producer, *a).status for a in (("A2", "A", 2), ("B1", "B", 1), ("C1", "C", 1))] == \
            ["committed"] * 3
        flow_invariant(producer)


def test_a_failed_advance_caught_inside_the_block_never_commits_a_flow_without_its_event(
    producer: Producer,
) -> None:
    """Regression: the flow UPDATE of an advance whose outbox INSERT failed must
    not ride along with the batch's COMMIT (the unsafe dual write advance()
    exists to prevent).  Each batched advance is all or nothing on its own."""
    reject_inserts(producer.location, "outbox", "injected", when="NEW.event_id = 'B1'")
    with producer.batch() as b:
        assert advance_step(b, "A1", "A", 1).status == "committed"
        with pytest.raises(integrity_error(producer.location), match="injected"):
            advance_step(b, "B1", "B", 1)
        assert producer.flow("B") is None  # already undone inside the batch
        assert advance_step(b, "C1", "C", 1).status == "committed"
    assert [r.event_id for r in b.results] == ["A1", "C1"]
    assert producer.store.in_transaction() is False
    allow_inserts(producer.location, "outbox")
    assert producer.flows() == ["A", "C"]
    assert [e.event_id for e in producer.outbox()] == ["A1", "C1"]
    flow_invariant(producer)
    assert advance_step(producer, "B1", "B", 1).status == "committed"  # not stale: nothing of it was kept


@pytest.mark.parametrize("how", ["normal", "raised"])
def test_the_batch_cannot_be_used_after_its_block(producer: Producer, how: str) -> None:
    with pytest.raises(Boom) if how == "raised" else ExitStack(), producer.batch() as b:
        advance_step(b, "A1", "A", 1)
        if how == "raised":
            raise Boom
    with pytest.raises(RuntimeError, match="closed"):
        advance_step(b, "B1", "B", 1)
    assert producer.flow("B") is None
    assert producer.flows() == (["A"] if how == "normal" else [])
    assert len(b.results) == 1
    assert producer.store.in_transaction() is False


def test_malformed_arguments_raise_inside_a_batch_and_write_nothing(producer: Producer) -> None:
    with producer.batch() as b:
        advance_step(b, "A1", "A", 1)
        with pytest.raises(InvalidEnvelope) as bad_seq:
            b.advance("B1", "B", expected_seq=True, kind="reserved", payload={"amount": 1})
        with pytest.raises(InvalidEnvelope) as bad_payload:
            b.advance("B1", "B", expected_seq=0, kind="reserved", payload={"amount": [1]})
        with pytest.raises(InvalidEnvelope) as bad_id:
            b.advance("", "B", expected_seq=0, kind="reserved", payload={"amount": 1})
        advance_step(b, "B1", "B", 1)
    assert (bad_seq.value.field, bad_payload.value.field, bad_id.value.field) == \
        ("expected_seq", "payload.amount", "event_id")
    assert [str(r.status) for r in b.results] == ["committed", "committed"]
    assert [e.event_id for e in producer.outbox()] == ["A1", "B1"]
    # Not caught: the whole batch goes.
    with pytest.raises(InvalidEnvelope), producer.batch() as b:
        advance_step(b, "C1", "C", 1)
        b.advance("D1", "D", expected_seq=-1, kind="reserved", payload={"amount": 1})
    assert producer.flow("C") is None and producer.store.in_transaction() is False


def test_an_empty_batch_writes_nothing(new_store: Any) -> None:
    with ExitStack() as stack:
        producer, consumer = pair(new_store, stack)
        before = snapshot(producer.location, consumer.location)
        with producer.batch() as b:
            pass
        assert b.results == [] and b.committed == 0
        assert snapshot(producer.location, consumer.location) == before


@pytest.mark.parametrize("inner", ["advance", "batch"])
def test_a_write_call_refused_inside_a_batch_neither_rolls_back_nor_splits_the_batch(
    producer: Producer, inner: str,
) -> None:
    """Regression: a failed BEGIN (here: a write call made inside the batch) must
    not roll back the batch's transaction it did not open; otherwise the batch's
    earlier advances vanish while the later ones (SAVEPOINT outside a
    transaction) autocommit one by one."""
    outcome: BaseException | None = None
    try:
        with producer.batch() as b:
            assert advance_step(b, "B1", "B", 1).status == "committed"
            with pytest.raises((*DB_ERRORS, RuntimeError, ReliableFlowError)):  # refused, somehow
                if inner == "advance":
                    advance_step(producer, "X1", "X", 1)
                else:
                    with producer.batch() as nested:
                        advance_step(nested, "X1", "X", 1)
            advance_step(b, "C1", "C", 1)
    except (*DB_ERRORS, RuntimeError, ReliableFlowError) as exc:  # refusing the batch is fine too
        outcome = exc
    assert producer.store.in_transaction() is False
    stored = {e.event_id for e in producer.outbox()}
    assert "X1" not in stored
    if outcome is None:  # the block reported success: every "committed" result is on disk
        assert stored == {"B1", "C1"}, stored
    else:
        assert stored == set(), (stored, outcome)  # the bug: {"C1"}, B1 lost, CommitOutcomeUnknown


# =====================================================================================
# 3. receive_many
# =====================================================================================


def test_receive_many_answers_like_receive_one_by_one(new_store: Any) -> None:
    envelopes: list[Any] = [
        envelope("A1", "A", 1),
        envelope("A1", "A", 1),                      # duplicate of the one just stored
        envelope("A1", "A", 1, amount=4),            # id_conflict
        envelope("A1-other", "A", 1),                # sequence_conflict
        json.dumps(envelope("A3", "A", 3)),          # JSON text, out of order
        envelope("B1", "B", 1, schema=2, payload={"units": 2}).copy(),  # undecodable: still accepted
        json.dumps(envelope("A3", "A", 3)).encode(),  # bytes, duplicate
    ]
    with Consumer(new_store("s"), RESERVATION) as single, Consumer(new_store("b"), RESERVATION) as batched:
        want = [single.receive(e) for e in envelopes]
        got = batched.receive_many(envelopes)
        assert got == want
        assert [str(r.status) for r in got] == [
            "accepted", "duplicate", "id_conflict", "sequence_conflict", "accepted", "accepted", "duplicate"]
        for flow_id in ("A", "B"):
            assert batched.inbox(flow_id) == single.inbox(flow_id)
        assert batched.receive_many([]) == []


@pytest.mark.parametrize("position", [0, 1, 2])
@pytest.mark.parametrize("bad, field", [
    ({"seq": 0}, "seq"),
    ({"extra": 1}, "extra"),
    ({"payload": {"amount": {"nested": 1}}}, "payload.amount"),
    ({"event_id": ""}, "event_id"),
    ("NaN", "envelope"),
    ("duplicate-key", "envelope"),
])
def test_receive_many_validates_every_envelope_before_storing_any(
    consumer: Consumer, position: int, bad: Any, field: str,
) -> None:
    envelopes: list[Any] = [envelope("A1", "A", 1), envelope("B1", "B", 1), envelope("C1", "C", 1)]
    if bad == "NaN":
        envelopes[position] = json.dumps(envelopes[position]).replace('"amount": 3', '"amount": NaN')
    elif bad == "duplicate-key":
        envelopes[position] = json.dumps(envelopes[position])[:-1] + ', "seq": 1}'
    else:
        envelopes[position] = {**envelopes[position], **bad}
    sqlite = not is_pg(consumer.location)
    with (traced(consumer._store._db.conn) if sqlite else nullcontext([])) as seen, \
            pytest.raises(InvalidEnvelope) as raised:
        consumer.receive_many(envelopes)
    assert count(seen, "INSERT") == 0, seen  # not even stored and rolled back (traced on SQLite)
    if field != "envelope":
        assert raised.value.field == field
    assert consumer.flows() == []
    assert consumer.store.in_transaction() is False
    assert [str(r.status) for r in consumer.receive_many(envelopes[:position])] == ["accepted"] * position


# =====================================================================================
# 4. relay_batch
# =====================================================================================


def build_relay_scene(new_store: Callable[[str], str], stack: ExitStack, name: str) -> tuple[Producer, Consumer]:
    """Seven events over four flows; the consumer already holds A1 (so: duplicate),
    a different body under B2's id (id_conflict) and another id at C1's slot
    (sequence_conflict)."""
    producer, consumer = pair(new_store, stack, name)
    commit_steps(producer, ("A1", "A", 1), ("B1", "B", 1), ("A2", "A", 2), ("C1", "C", 1),
                 ("B2", "B", 2), ("A3", "A", 3), ("D1", "D", 1))
    assert consumer.receive(producer.event("A1")).status == "accepted"  # type: ignore[arg-type]
    assert consumer.receive(envelope("B2", "B", 2, amount=9)).status == "accepted"
    assert consumer.receive(envelope("X-C1", "C", 1)).status == "accepted"
    return producer, consumer


@pytest.mark.parametrize("limit", [1, 2, 3, 100])
def test_relay_batch_delivers_in_relay_order_with_the_same_statuses_and_marks(new_store: Any, limit: int) -> None:
    with ExitStack() as stack:
        p1, c1 = build_relay_scene(new_store, stack, "1")
        p2, c2 = build_relay_scene(new_store, stack, "2")
        want = relay_until_idle(p1, c1)
        got = relay_all_batched(p2, c2, limit)
        assert got == want
        assert [(r.event_id, str(r.status)) for r in got] == [
            ("A1", "duplicate"), ("B1", "accepted"), ("A2", "accepted"), ("C1", "sequence_conflict"),
            ("B2", "id_conflict"), ("A3", "accepted"), ("D1", "accepted")]
        s1, s2 = snapshot(p1.location, c1.location), snapshot(p2.location, c2.location)
        assert s2 == s1
        states = {e.event_id: (e.state, e.accepted, e.last_status) for e in p2.outbox()}
        assert states["C1"] == ("set_aside", False, "sequence_conflict")
        assert states["B2"] == ("set_aside", False, "id_conflict")
        assert all(states[e][:2] == ("accepted", True) for e in ("A1", "B1", "A2", "A3", "D1"))
        # Set-aside events are not sent again: the next batch is idle.
        assert relay_batch(p2, c2, limit=limit).idle


def test_relay_batch_counts_by_status_and_never_counts_a_conflict_as_accepted(new_store: Any) -> None:
    with ExitStack() as stack:
        producer, consumer = build_relay_scene(new_store, stack, "")
        r = relay_batch(producer, consumer, limit=100)
        assert r.counts == {"duplicate": 1, "accepted": 4, "sequence_conflict": 1, "id_conflict": 1}
        assert (r.refused, r.idle, len(r.results)) == (0, False, 7)
        assert sum(1 for e in producer.outbox() if e.accepted) == 5
        assert all(isinstance(x, RelayResult) for x in r.results)
        again = relay_batch(producer, consumer, limit=100)
        assert (again.results, again.counts, again.refused, again.idle) == ((), {}, 0, True)


def test_relay_batch_limit_picks_the_first_events_only(new_store: Any) -> None:
    with ExitStack() as stack:
        producer, consumer = pair(new_store, stack)
        commit_steps(producer, ("A1", "A", 1), ("B1", "B", 1), ("A2", "A", 2))
        r = relay_batch(producer, consumer, limit=2)
        assert [x.event_id for x in r.results] == ["A1", "B1"] and r.counts == {"accepted": 2}
        assert [e.accepted for e in producer.outbox()] == [True, True, False]
        assert consumer.inbox("A") == [InboxEntry(event_id="A1", seq=1, state="pending", reason=None)]


def test_relay_batch_is_idle_when_nothing_is_left(new_store: Any) -> None:
    with ExitStack() as stack:
        producer, consumer = pair(new_store, stack)
        r = relay_batch(producer, consumer)
        assert (r.results, r.counts, r.refused, r.idle) == ((), {}, 0, True)
        commit_steps(producer, ("A1", "A", 1))
        assert not relay_batch(producer, consumer).idle
        assert relay_batch(producer, consumer).idle
        assert relay(producer, consumer).status == "idle"


@pytest.mark.parametrize("limit", [0, -1, True, False, 1.5, "3", None])
def test_relay_batch_refuses_a_bad_limit_before_doing_anything(new_store: Any, limit: Any) -> None:
    with ExitStack() as stack:
        producer, consumer = pair(new_store, stack)
        commit_steps(producer, ("A1", "A", 1))
        with pytest.raises(ValueError, match="limit"):
            relay_batch(producer, consumer, limit=limit)
        assert producer.outbox()[0].deliveries == {}  # not even bound
        assert consumer.flows() == []


def test_relay_batch_sql_failure_in_the_consumer_stores_nothing_of_the_batch(new_store: Any) -> None:
    with ExitStack() as stack:
        producer, consumer = pair(new_store, stack)
        commit_steps(producer, ("A1", "A", 1), ("B1", "B", 1), ("C1", "C", 1))
        reject_inserts(consumer.location, "inbox", "injected inbox failure", when="NEW.event_id = 'B1'")
        with pytest.raises(integrity_error(consumer.location), match="injected inbox failure"):
            relay_batch(producer, consumer, limit=100, policy=FIXED)
        assert consumer.flows() == [] and consumer.store.in_transaction() is False
        assert producer.store.in_transaction() is False
        for event_id in ("A1", "B1", "C1"):
            d = outbox_entry(producer, event_id, "default").deliveries["default"]
            assert (d.state, d.attempts) == ("pending", 1)
            assert "injected inbox failure" in d.last_error
        allow_inserts(consumer.location, "inbox")
        assert relay_batch(producer, consumer, limit=100).counts == {"accepted": 3}


@pytest.mark.parametrize("call", ["relay", "relay_batch"])
def test_relaying_inside_an_open_batch_never_delivers_an_uncommitted_event(new_store: Any, call: str) -> None:
    """Regression: on the producer's own connection, inside an open batch, relay
    would see the batch's uncommitted events and the consumer would commit (and
    apply) an event the producer then rolled back."""
    with ExitStack() as stack:
        producer, consumer = pair(new_store, stack)
        assert relay_batch(producer, consumer).idle  # the consumer is bound already
        refused: BaseException | None = None
        try:
            with producer.batch() as b:
                advance_step(b, "A1", "A", 1)
                if call == "relay":
                    relay(producer, consumer)
                else:
                    relay_batch(producer, consumer, limit=100)
        except (*DB_ERRORS, RuntimeError, ReliableFlowError) as exc:
            refused = exc  # refusing to relay inside a batch is a fine answer
        assert producer.store.in_transaction() is False
        committed = {e.event_id for e in producer.outbox()}
        received = {r.event_id for f in consumer.flows() for r in consumer.inbox(f)}
        assert received <= committed, (received, committed, refused)  # the bug: {"A1"} vs set()


def test_relay_batch_leaves_a_second_consumer_untouched(tmp_path: Path, new_store: Any) -> None:
    with ExitStack() as stack:
        producer, main = pair(new_store, stack)
        audit = stack.enter_context(Consumer(new_store("audit"), RESERVATION, name="audit"))
        commit_steps(producer, ("A1", "A", 1), ("B1", "B", 1), ("A2", "A", 2))
        assert [x.event_id for x in relay_batch(producer, audit, limit=1).results] == ["A1"]
        assert relay_batch(producer, main, limit=100, register=True).counts == {"accepted": 3}
        assert [e.state for e in producer.outbox(consumer="audit")] == ["accepted", "pending", "pending"]
        assert [e.state for e in producer.outbox(consumer="default")] == ["accepted"] * 3
        assert [e.accepted for e in producer.outbox()] == [True, False, False]
        assert audit.flows() == ["A"] and len(audit.inbox("A")) == 1
        r = relay_batch(producer, audit, limit=100)
        assert [(x.event_id, str(x.status)) for x in r.results] == [("B1", "accepted"), ("A2", "accepted")]
        assert relay_batch(producer, main).idle and relay_batch(producer, audit).idle
        assert [e.accepted for e in producer.outbox()] == [True, True, True]


FIXED = DeliveryPolicy(wait_for_due=False, clock=lambda: 1000.0, random=lambda: 0.5, backoff_base=0.5)


@pytest.mark.parametrize("wait_for_due", [False, True])
def test_relay_batch_refused_part_way_by_a_full_inbox_keeps_the_rest_pending_and_delivers_all_later(
    new_store: Any, wait_for_due: bool,
) -> None:
    now = [1000.0]
    policy = DeliveryPolicy(wait_for_due=wait_for_due, clock=lambda: now[0], random=lambda: 0.5, backoff_base=0.5)
    with ExitStack() as stack:
        producer, consumer = pair(new_store, stack, max_inbox=2)
        commit_steps(producer, ("A1", "A", 1), ("A2", "A", 2), ("A3", "A", 3),
                     ("B1", "B", 1), ("B2", "B", 2), ("B3", "B", 3))
        r = relay_batch(producer, consumer, limit=100, policy=policy)
        # A3 and B2, B3 are refused; B1 is B's next step, so it still gets in.
        assert [(x.event_id, str(x.status)) for x in r.results] == [
            ("A1", "accepted"), ("A2", "accepted"), ("A3", "refused"),
            ("B1", "accepted"), ("B2", "refused"), ("B3", "refused"),
        ]
        assert (r.counts, r.refused, r.idle) == ({"accepted": 3, "refused": 3}, 3, False)
        assert consumer.flows() == ["A", "B"] and [x.event_id for x in consumer.inbox("A")] == ["A1", "A2"]
        for event_id in ("A1", "A2", "B1"):
            assert outbox_entry(producer, event_id, "default").state == "accepted"
        for event_id in ("A3", "B2", "B3"):
            e = outbox_entry(producer, event_id, "default")
            d = e.deliveries["default"]
            assert (e.state, e.accepted, d.attempts) == ("pending", False, 1), event_id
            assert d.last_error.startswith("InboxFull"), d
            assert d.due_at == 1000.0 + 0.5 * 0.5  # backoff recorded
        consumer.process_all()
        if wait_for_due:  # backing off: not sent before the due time
            assert relay_batch(producer, consumer, limit=100, policy=policy).idle
            assert outbox_entry(producer, "A3", "default").deliveries["default"].attempts == 1
        now[0] = 1001.0
        # Nothing is dropped: relay again, apply, until idle.
        rounds: list[tuple[list[str | None], int]] = []
        for _ in range(10):
            r = relay_batch(producer, consumer, limit=100, policy=policy)
            now[0] += 1
            consumer.process_all()
            if r.idle:
                break
            rounds.append(([x.event_id for x in r.results if x.status != "refused"], r.refused))
        else:
            raise AssertionError(f"never idle: {rounds}")
        assert rounds == [(["A3", "B2"], 1), (["B3"], 0)]
        consumer.process_all()
        assert all(e.accepted for e in producer.outbox())
        for flow_id in "AB":
            assert [x.event_id for x in consumer.applied(flow_id)] == [f"{flow_id}{n}" for n in (1, 2, 3)]
            assert consumer.projection(flow_id) == {"state": "released", "last_seq": 3, "held": 0}


def test_relay_batch_with_every_event_refused_stores_nothing_and_retries_later(new_store: Any) -> None:
    """Every picked event refused: nothing stored, nothing accepted, all counted
    in ``refused`` with a backoff recorded, and all delivered later."""
    with ExitStack() as stack:
        producer, consumer = pair(new_store, stack, max_inbox=1)
        commit_steps(producer, ("A1", "A", 1), ("A2", "A", 2), ("A3", "A", 3))
        assert relay_batch(producer, consumer, limit=1, policy=FIXED).counts == {"accepted": 1}
        r = relay_batch(producer, consumer, limit=100, policy=FIXED)
        assert [(x.event_id, x.status) for x in r.results] == [("A2", "refused"), ("A3", "refused")]
        assert (r.counts, r.refused, r.idle) == ({"refused": 2}, 2, False)
        assert "inbox full (max_inbox 1)" in (r.results[0].reason or "")
        assert [x.event_id for x in consumer.inbox("A")] == ["A1"]
        assert consumer.store.in_transaction() is False
        for event_id in ("A2", "A3"):
            d = outbox_entry(producer, event_id, "default").deliveries["default"]
            assert (d.state, d.attempts) == ("pending", 1) and d.last_error.startswith("InboxFull")
        consumer.process_all()
        r = relay_batch(producer, consumer, limit=100, policy=FIXED)
        assert [(x.event_id, x.status) for x in r.results] == [("A2", "accepted"), ("A3", "refused")]
        assert r.refused == 1  # A2 is the next step
        consumer.process_all()
        assert [x.event_id for x in relay_batch(producer, consumer, limit=100, policy=FIXED).results] == ["A3"]
        consumer.process_all()
        assert [e.event_id for e in consumer.applied("A")] == ["A1", "A2", "A3"]


def test_relay_batch_lets_in_what_repeated_relay_lets_in_when_the_inbox_is_full(new_store: Any) -> None:
    steps = [(f"{f}{n}", f, n) for f in "ABCD" for n in (1, 2, 3)]
    policy = DeliveryPolicy(clock=lambda: 1000.0, random=lambda: 0.5)
    inboxes = []
    for mode in ("one_by_one", "batch"):
        with ExitStack() as stack:
            producer, consumer = pair(new_store, stack, name=mode, max_inbox=3)
            commit_steps(producer, *steps)
            if mode == "batch":
                relay_batch(producer, consumer, limit=100, policy=policy)
            else:
                while relay(producer, consumer, policy=policy).status != "idle":
                    pass
            inboxes.append({f: [x.event_id for x in consumer.inbox(f)] for f in "ABCD"})
            inboxes.append([(e.event_id, e.state) for e in producer.outbox()])
    assert inboxes[0] == inboxes[2] and inboxes[1] == inboxes[3]
    assert inboxes[0] == {"A": ["A1", "A2", "A3"], "B": ["B1"], "C": ["C1"], "D": ["D1"]}


# =====================================================================================
# 5. drain / process_all with batch_size
# =====================================================================================

# name -> (envelopes of flow T, how many apply in a row, stop after them, the event it stops at)
SCENES: dict[str, tuple[list[dict[str, Any]], int, str, tuple[str, int, str | None, str | None]]] = {
    "idle": ([tick("T", n) for n in range(1, 7)] + [tick("T", 7, kind="done")], 7, "idle",
             ("idle", 8, None, None)),
    "gap": ([tick("T", n) for n in (1, 2, 3, 4, 6, 7)], 4, "gap", ("gap", 5, None, None)),
    "unsupported_schema": (
        [tick("T", n) for n in (1, 2, 3)] + [tick("T", 4, schema=2, payload={"count": 1})]
        + [tick("T", n) for n in (5, 6)], 3, "blocked", ("blocked", 4, "T4", "unsupported_schema")),
    "invalid_payload": (
        [tick("T", n) for n in (1, 2, 3)] + [tick("T", 4, payload={"n": 0}), tick("T", 5)], 3, "blocked",
        ("blocked", 4, "T4", "invalid_payload")),
    "invalid_transition": (
        [tick("T", n) for n in (1, 2, 3)] + [tick("T", 4, kind="idle"), tick("T", 5)], 3, "blocked",
        ("blocked", 4, "T4", "invalid_transition")),
}


def expected_drain(scene: str, limit: int) -> tuple[int, str, tuple[str, int, str | None, str | None]]:
    _, run, stop, last = SCENES[scene]
    if limit <= run:  # stops as soon as limit events applied, without looking further
        return limit, "limit", ("applied", limit, f"T{limit}", None)
    return run, stop, last


def shape(result: DrainResult) -> tuple[int, str, tuple[str, int, str | None, str | None]]:
    last = result.last
    assert last is not None and last.flow_id == result.flow_id
    reason = None if last.reason is None else str(last.reason)
    return result.applied, str(result.stop), (str(last.status), last.seq, last.event_id, reason)


def check_consumer_after(consumer: Consumer, flow_id: str, envelopes: list[dict[str, Any]], applied: int,
                         blocked: tuple[int, str] | None) -> None:
    rows = consumer.inbox(flow_id)
    want: list[tuple[int, str, str | None]] = []
    for e in sorted(envelopes, key=lambda e: e["seq"]):
        seq = e["seq"]
        if seq <= applied:
            want.append((seq, "applied", None))
        elif blocked is not None and seq == blocked[0]:
            want.append((seq, "blocked", blocked[1]))
        else:
            want.append((seq, "pending", None))
    assert [(r.seq, r.state, r.reason) for r in rows] == want
    assert [e.seq for e in consumer.applied(flow_id)] == list(range(1, applied + 1))
    projection = consumer.projection(flow_id)
    assert projection is not None
    assert (projection["last_seq"], projection["steps"]) == (applied, applied)


@pytest.mark.parametrize("batch_size", [1, 2, 5, 100])
@pytest.mark.parametrize("limit", [1, 3, 4, 7, 100])
@pytest.mark.parametrize("scene", list(SCENES))
def test_drain_stops_where_the_single_step_path_stops(
    new_store: Any, scene: str, limit: int, batch_size: int,
) -> None:
    envelopes = SCENES[scene][0]
    with Consumer(new_store("c"), TICKER) as consumer:
        assert {str(r.status) for r in consumer.receive_many(envelopes)} == {"accepted"}
        result = consumer.drain("T", limit=limit, batch_size=batch_size)
        want = expected_drain(scene, limit)
        assert shape(result) == want
        assert result.flow_id == "T"
        # A blocked event inside a batch: the applies before it stay committed,
        # and the blocked mark is written; a limit stop never looks at it.
        blocked = (want[2][1], want[2][3]) if want[1] == "blocked" else None
        check_consumer_after(consumer, "T", envelopes, want[0], blocked)  # type: ignore[arg-type]
        assert consumer.store.in_transaction() is False


@pytest.mark.parametrize("batch_size", [1, 2, 5, 100])
def test_drain_batches_match_repeated_apply_next(new_store: Any, batch_size: int) -> None:
    """The single-event path itself, step by step, against one drain call."""
    for scene, (envelopes, *_rest) in SCENES.items():
        with Consumer(new_store(f"s-{scene}"), TICKER) as single, \
                Consumer(new_store(f"b-{scene}"), TICKER) as batched:
            single.receive_many(envelopes)
            batched.receive_many(envelopes)
            steps: list[ApplyResult] = []
            while not steps or steps[-1].status == "applied":
                steps.append(single.apply_next("T"))
            drained = batched.drain("T", limit=1000, batch_size=batch_size)
            assert drained.applied == len(steps) - 1, scene
            assert drained.last == steps[-1], scene
            assert str(drained.stop) == str(steps[-1].status), scene
            assert batched.inbox("T") == single.inbox("T")
            assert batched.applied("T") == single.applied("T")
            assert batched.projection("T") == single.projection("T")


@pytest.mark.parametrize("batch_size", [1, 2, 5, 100])
def test_a_blocked_schema_applies_unchanged_after_the_upgrade(new_store: Any, batch_size: int) -> None:
    envelopes = SCENES["unsupported_schema"][0]
    location = new_store("c")
    with Consumer(location, TICKER) as old:
        old.receive_many(envelopes)
        assert shape(old.drain("T", batch_size=batch_size))[:2] == (3, "blocked")
        assert shape(old.drain("T", batch_size=batch_size))[:2] == (0, "blocked")  # re-examined, still blocked
    with Consumer(location, TICKER, schemas={1, 2}) as new:
        assert shape(new.drain("T", batch_size=batch_size)) == (3, "idle", ("idle", 7, None, None))
        assert [e.event_id for e in new.applied("T")] == [f"T{n}" for n in range(1, 7)]
        assert new.inbox("T")[3] == InboxEntry(event_id="T4", seq=4, state="applied", reason=None)


@pytest.mark.parametrize("batch_size", [1, 2, 5, 100])
@pytest.mark.parametrize("limit", [1, 3, 4, 100])
def test_process_all_stops_each_flow_where_the_single_step_path_stops(
    new_store: Any, limit: int, batch_size: int,
) -> None:
    with Consumer(new_store("c"), TICKER) as consumer:
        for scene, (envelopes, *_rest) in SCENES.items():
            consumer.receive_many([{**e, "flow_id": scene, "event_id": f"{scene}-{e['seq']}"} for e in envelopes])
        consumer.receive_many([tick("done", 1), tick("done", 2, kind="done")])
        assert consumer.drain("done").applied == 2  # fully applied: not listed by process_all
        results = consumer.process_all(limit=limit, batch_size=batch_size)
        assert list(results) == sorted(SCENES)
        for scene, result in results.items():
            applied, stop, (status, seq, event_id, reason) = expected_drain(scene, limit)
            event_id = None if event_id is None else f"{scene}-{seq}"
            assert shape(result) == (applied, stop, (status, seq, event_id, reason)), scene
            assert result.flow_id == scene
            assert len(consumer.applied(scene)) == applied


def test_a_sql_failure_in_a_drain_batch_keeps_the_earlier_batches_and_rolls_back_its_own(new_store: Any) -> None:
    with Consumer(new_store("c"), TICKER) as consumer:
        consumer.receive_many([tick("T", n) for n in range(1, 13)])
        reject_inserts(consumer.location, "effect", "injected effect failure", when="NEW.event_id = 'T7'")
        with pytest.raises(integrity_error(consumer.location), match="injected effect failure"):
            consumer.drain("T", limit=100, batch_size=5)
        assert consumer.store.in_transaction() is False
        assert [e.seq for e in consumer.applied("T")] == [1, 2, 3, 4, 5]  # T6 went with T7's batch
        assert [r.state for r in consumer.inbox("T")] == ["applied"] * 5 + ["pending"] * 7
        allow_inserts(consumer.location, "effect")
        assert shape(consumer.drain("T", limit=100, batch_size=5))[:2] == (7, "idle")
        assert [e.seq for e in consumer.applied("T")] == list(range(1, 13))


@pytest.mark.parametrize("batch_size", [0, -1, True, False, 1.5, "2", None])
def test_drain_and_process_all_refuse_a_bad_batch_size(new_store: Any, batch_size: Any) -> None:
    with Consumer(new_store("c"), TICKER) as consumer:
        consumer.receive_many([tick("T", 1), tick("T", 2)])
        with deadline(10), pytest.raises(ValueError, match="batch_size"):
            consumer.drain("T", limit=10, batch_size=batch_size)
        with deadline(10), pytest.raises(ValueError, match="batch_size"):
            consumer.process_all(limit=10, batch_size=batch_size)
        assert consumer.applied("T") == [] and consumer.projection("T") is None


@pytest.mark.parametrize("limit", [0, -1, True, 1.5])
def test_drain_and_process_all_refuse_a_bad_limit_with_batches(new_store: Any, limit: Any) -> None:
    with Consumer(new_store("c"), TICKER) as consumer:
        consumer.receive_many([tick("T", 1)])
        with pytest.raises(ValueError, match="limit"):
            consumer.drain("T", limit=limit, batch_size=5)
        with pytest.raises(ValueError, match="limit"):
            consumer.process_all(limit=limit, batch_size=5)
        assert consumer.applied("T") == []


# =====================================================================================
# 6. Crash points inside batches (real child processes)
# =====================================================================================


def run_child(tmp_path: Path, crash_at: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = child_env() if crash_at is None else child_env(**{ENV_VAR: crash_at})
    return run_script(BATCH_CHILD, *args, env=env, cwd=tmp_path)


def crashed(child: subprocess.CompletedProcess[str]) -> None:
    assert child.returncode == CRASH_EXIT_CODE, (child.returncode, child.stderr)
    assert child.stdout == "" and child.stderr == ""


def apply_until_idle(consumer: Consumer, batch_size: int = 5) -> None:
    for result in consumer.process_all(batch_size=batch_size).values():
        assert result.stop == "idle", result


FINAL_ADVANCE_STATE = {
    "effects": {"A": ["A1", "A2"], "B": ["B1"], "C": ["C1"], "Z": ["Z1"]},
    "projections": {
        "A": {"state": "confirmed", "last_seq": 2, "held": 3},
        "B": {"state": "reserved", "last_seq": 1, "held": 5},
        "C": {"state": "reserved", "last_seq": 1, "held": 7},
        "Z": {"state": "reserved", "last_seq": 1, "held": 9},
    },
}


def check_final(producer: Producer, consumer: Consumer, final: dict[str, Any]) -> None:
    for flow_id, event_ids in final["effects"].items():
        assert [e.event_id for e in consumer.applied(flow_id)] == event_ids, flow_id
    for flow_id, projection in final["projections"].items():
        assert consumer.projection(flow_id) == projection, flow_id
    assert all(e.accepted for e in producer.outbox())
    flow_invariant(producer)


@pytest.mark.parametrize("point, visible", [
    ("advance.after_flow_write", False),
    ("advance.after_outbox_insert", False),
    ("advance.after_commit", True),
])
def test_a_crash_inside_an_advance_batch_leaves_none_of_it_and_after_its_commit_all_of_it(
    tmp_path: Path, new_store: Any, point: str, visible: bool,
) -> None:
    p_path, c_path = new_store("producer"), new_store("consumer")
    with Producer(p_path, RESERVATION) as producer, Consumer(c_path, RESERVATION):
        assert producer.advance(**ADVANCE_BATCH_PRE).status == "committed"
    crashed(run_child(tmp_path, point, "advance-batch", str(p_path)))
    snap = snapshot(p_path, c_path)["producer"]
    batch_flows = {"A": {"state": "confirmed", "seq": 2, "amount": 3},
                   "B": {"state": "reserved", "seq": 1, "amount": 5},
                   "C": {"state": "reserved", "seq": 1, "amount": 7}}
    z = {"Z": {"state": "reserved", "seq": 1, "amount": 9}}
    if visible:
        assert snap["flows"] == {**batch_flows, **z}
        assert [e["event_id"] for es in snap["outbox"].values() for e in es] == ["Z1", "A1", "A2", "B1", "C1"]
    else:
        assert snap["flows"] == z
        assert {f: [e["event_id"] for e in es] for f, es in snap["outbox"].items()} == {"Z": ["Z1"]}
    # Recovery: the same batch again, relay until idle, apply.
    with Producer(p_path, RESERVATION) as producer, Consumer(c_path, RESERVATION, schemas={1, 2}) as consumer:
        with producer.batch() as b:
            for call in ADVANCE_BATCH:
                b.advance(**call)
        again = "existing" if visible else "committed"
        assert [str(r.status) for r in b.results] == ["existing", "stale"] + [again] * 4
        assert sorted(str(x.event_id) for x in relay_all_batched(producer, consumer, 100)) == \
            ["A1", "A2", "B1", "C1", "Z1"]
        apply_until_idle(consumer)
        check_final(producer, consumer, FINAL_ADVANCE_STATE)


def test_the_advance_batch_child_runs_to_the_end_without_a_crash_point(tmp_path: Path, new_store: Any) -> None:
    p_path = new_store("producer")
    with Producer(p_path, RESERVATION) as producer:
        producer.advance(**ADVANCE_BATCH_PRE)
    child = run_child(tmp_path, None, "advance-batch", str(p_path))
    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout) == ["existing", "stale"] + ["committed"] * 4


def setup_relay_scene(p_path: Path, c_path: Path) -> None:
    with Producer(p_path, RESERVATION) as producer, Consumer(c_path, RESERVATION) as consumer:
        commit_steps(producer, ("A1", "A", 1), ("A2", "A", 2), ("B1", "B", 1), ("C1", "C", 1))
        assert consumer.receive(producer.event("A1")).status == "accepted"  # type: ignore[arg-type]


PENDING_ALL = {"A": [("A1", "pending"), ("A2", "pending")], "B": [("B1", "pending")], "C": [("C1", "pending")]}
RELAY_FINAL = {
    "effects": {"A": ["A1", "A2"], "B": ["B1"], "C": ["C1"]},
    "projections": {"A": {"state": "confirmed", "last_seq": 2, "held": 3},
                    "B": {"state": "reserved", "last_seq": 1, "held": 3},
                    "C": {"state": "reserved", "last_seq": 1, "held": 3}},
}


@pytest.mark.parametrize("point, inbox, accepted, recovery", [
    ("receive.after_inbox_insert", {"A": [("A1", "pending")]}, False,
     ["duplicate", "accepted", "accepted", "accepted"]),
    ("receive.after_commit", PENDING_ALL, False, ["duplicate"] * 4),
    ("relay.after_mark", PENDING_ALL, False, ["duplicate"] * 4),
    ("relay.after_commit", PENDING_ALL, True, []),
])
def test_a_crash_inside_relay_batch_leaves_the_spec_state_and_recovers(
    tmp_path: Path, new_store: Any, point: str, inbox: dict[str, list[tuple[str, str]]], accepted: bool, recovery: list[str],
) -> None:
    p_path, c_path = new_store("producer"), new_store("consumer")
    setup_relay_scene(p_path, c_path)
    crashed(run_child(tmp_path, point, "relay-batch", str(p_path), str(c_path)))
    snap = snapshot(p_path, c_path)
    assert {f: [(r["event_id"], r["state"]) for r in rows] for f, rows in snap["consumer"]["inbox"].items()} == inbox
    assert [(e["event_id"], e["accepted"]) for es in snap["producer"]["outbox"].values() for e in es] == \
        [(e, accepted) for e in ("A1", "A2", "B1", "C1")]
    assert snap["consumer"]["effects"] == {f: [] for f in inbox}
    with Producer(p_path, RESERVATION) as producer, Consumer(c_path, RESERVATION) as consumer:
        got = relay_all_batched(producer, consumer, 100)
        assert [(x.event_id, str(x.status)) for x in got] == list(zip(["A1", "A2", "B1", "C1"], recovery))
        apply_until_idle(consumer)
        check_final(producer, consumer, RELAY_FINAL)


def test_the_relay_batch_child_runs_to_the_end_without_a_crash_point(tmp_path: Path, new_store: Any) -> None:
    p_path, c_path = new_store("producer"), new_store("consumer")
    setup_relay_scene(p_path, c_path)
    child = run_child(tmp_path, None, "relay-batch", str(p_path), str(c_path))
    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout) == ["duplicate", "accepted", "accepted", "accepted"]


def setup_apply_scene(mode: str, c_path: Path) -> tuple[list[str], Any]:
    """drain: one TICKER flow of 12 events; process_all: four reservation flows of 3."""
    if mode == "drain":
        with Consumer(c_path, TICKER) as consumer:
            consumer.receive_many([tick("T", n) for n in range(1, 12)] + [tick("T", 12, kind="done")])
        return ["drain", "ticker", str(c_path), "T", "5"], TICKER
    with Consumer(c_path, RESERVATION) as consumer:
        consumer.receive_many([envelope(f"{f}{n}", f, n) for f in "ABCD" for n in (1, 2, 3)])
    return ["process-all", "reservation", str(c_path), "5"], RESERVATION


def event_ids(mode: str) -> dict[str, list[str]]:
    if mode == "drain":
        return {"T": [f"T{n}" for n in range(1, 13)]}
    return {f: [f"{f}{n}" for n in (1, 2, 3)] for f in "ABCD"}


@pytest.mark.parametrize("mode", ["drain", "process_all"])
@pytest.mark.parametrize("point, first_batch_visible", [
    ("apply.after_projection", False),
    ("apply.after_effect", False),
    ("apply.after_commit", True),
])
def test_a_crash_inside_an_apply_batch_leaves_none_of_it_and_after_its_commit_all_of_it(
    tmp_path: Path, new_store: Any, mode: str, point: str, first_batch_visible: bool,
) -> None:
    c_path = new_store("consumer")
    args, protocol = setup_apply_scene(mode, c_path)
    crashed(run_child(tmp_path, point, *args))
    ids = event_ids(mode)
    order = [e for f in sorted(ids) for e in ids[f]]
    applied = set(order[:5]) if first_batch_visible else set()  # batch_size=5: the first five
    with Consumer(c_path, protocol) as consumer:
        for flow_id, events in ids.items():
            rows = consumer.inbox(flow_id)
            assert [(r.event_id, r.state) for r in rows] == \
                [(e, "applied" if e in applied else "pending") for e in events]
            assert [e.event_id for e in consumer.applied(flow_id)] == [e for e in events if e in applied]
            n = sum(1 for e in events if e in applied)
            projection = consumer.projection(flow_id)
            assert (projection or {}).get("last_seq", 0) == n
        # Recovery: the same drain again, until idle; one effect per event.
        if mode == "drain":
            result = consumer.drain("T", limit=1000, batch_size=5)
            assert (result.applied, str(result.stop)) == (12 - len(applied), "idle")
        else:
            apply_until_idle(consumer)
        for flow_id, events in ids.items():
            assert [e.event_id for e in consumer.applied(flow_id)] == events
            assert all(r.state == "applied" for r in consumer.inbox(flow_id))
        if mode == "drain":
            assert consumer.projection("T") == {"state": "done", "last_seq": 12, "n": 1, "steps": 12}
        else:
            for flow_id in "ABCD":
                assert consumer.projection(flow_id) == {"state": "released", "last_seq": 3, "held": 0}


@pytest.mark.parametrize("mode", ["drain", "process_all"])
def test_the_apply_batch_child_runs_to_the_end_without_a_crash_point(tmp_path: Path, new_store: Any, mode: str) -> None:
    args, _ = setup_apply_scene(mode, new_store("consumer"))
    child = run_child(tmp_path, None, *args)
    assert child.returncode == 0, child.stderr
    want: Any = [12, "idle"] if mode == "drain" else {f: [3, "idle"] for f in "ABCD"}
    assert json.loads(child.stdout) == want
