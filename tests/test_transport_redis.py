"""The Redis transport (issue 22) against a real ``redis-server`` and real stores:
``RedisReceiver`` on the producer's side, ``Bridge`` on the consumer's.

* the same statuses and rows as an in-process relay, on both engines of the
  consumer store (``relay``, ``relay_batch`` at 1, 10 and 100, ``Worker``);
* failure semantics: no bridge (a failed send, retried), an answer after its
  deadline (ignored), another store under the name (``ConsumerMismatch``);
* a bridge that dies between the inbox commit and the acknowledgement: the
  request is served again (by the same name, or claimed by another), the
  inbox says ``duplicate``, nothing is applied twice;
* a Redis server restarted empty: the group and the announcement come back;
* bad input on the streams: refused, recorded, acknowledged, never applied,
  never blocking what comes behind;
* bad arguments, and the CLI (``bridge`` / ``run --to``) end to end.

The bridges run in threads of their own (a Consumer belongs to the thread that
opened it), each opening its own Consumer on the store.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from engine_reads import rows
from redis_server import import_redis
from reliable_flow import Consumer, Producer, Worker, relay, relay_batch
from reliable_flow.aio import AsyncProducer, AsyncWorker
from reliable_flow.errors import ConsumerMismatch, InvalidEnvelope, RemoteError, TransportError
from reliable_flow.records import PassResult, WorkerStats
from reliable_flow.reservation import RESERVATION
from support import (
    canonical_body,
    child_env,
    child_process,
    commit,
    envelope,
    outbox_entry,
    run_cli,
)

redis = import_redis()

from reliable_flow.transport import _wire as wire
from reliable_flow.transport.redis import Bridge, RedisReceiver
from reliable_flow.transport.redis._bridge import GROUP

pytestmark = pytest.mark.redis

NAME = "default"  # the consumer's name (the stores' default)
REQUESTS = "rf:{default}:requests"
REFUSED = "rf:{default}:refused"
ANNOUNCED = "rf:{default}:consumer"


# -- a bridge in a thread of its own ------------------------------------------------------


class BridgeThread:
    """A :class:`Bridge` (or ``cls``) serving the consumer store at ``location``
    from a thread of its own, which opens the Consumer (``consumer_kw``).
    ``start()`` returns once the bridge announced the consumer; ``stop()``
    waits for the thread.  ``error``: what ended the thread, if anything."""

    def __init__(self, location: str, url: str, *, cls: type[Bridge] = Bridge,
                 consumer_kw: dict[str, Any] | None = None, **bridge_kw: Any) -> None:
        self.location, self.url, self.cls = location, url, cls
        self.consumer_kw = consumer_kw or {}
        self.bridge_kw = {"block": 0.05, **bridge_kw}
        self.bridge: Bridge | None = None
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        try:
            with Consumer(self.location, RESERVATION, **self.consumer_kw) as consumer:
                bridge = self.cls(consumer, self.url, **self.bridge_kw)
                self.bridge = bridge
                self._ready.set()
                try:
                    bridge.run(handle_signals=False)
                finally:
                    bridge.close()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc
        finally:
            self._ready.set()

    def start(self) -> BridgeThread:
        self.thread.start()
        assert self._ready.wait(20), "the bridge did not start"
        if self.error is not None:
            raise self.error
        return self

    def stop(self) -> None:
        if self.bridge is not None:
            self.bridge.stop()
        self.thread.join(20)
        assert not self.thread.is_alive(), "the bridge did not stop"

    @property
    def stats(self) -> Any:
        assert self.bridge is not None
        return self.bridge.stats


@contextmanager
def serving(location: str, url: str, **kw: Any) -> Iterator[BridgeThread]:
    b = BridgeThread(location, url, **kw).start()
    try:
        yield b
    finally:
        b.stop()
    if b.error is not None:
        raise b.error


@pytest.fixture
def client(redis_url: str) -> Iterator[Any]:
    """A plain Redis client on the test's (emptied) server, for writing by hand."""
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def eventually(check: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    end = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.02)


# -- what a relay and a store show ----------------------------------------------------------


def raw_inbox(location: str) -> list[tuple[Any, ...]]:
    return rows(location, "SELECT event_id, flow_id, seq, body, state FROM inbox ORDER BY event_id")


def raw_delivery(location: str) -> list[tuple[Any, ...]]:
    return rows(location, "SELECT d.consumer, o.event_id, d.state, d.last_status, d.attempts "
                          "FROM delivery d JOIN outbox o ON o.pos = d.pos ORDER BY d.consumer, d.pos")


def shown(r: Any) -> tuple[Any, ...]:
    """A relay result without the text of its reason (which names the store)."""
    return (str(r.status), r.event_id, r.flow_id, r.seq, r.applied, bool(r.reason))


def consumer_picture(location: str, flows: list[str]) -> dict[str, Any]:
    """Inbox rows, projections and applied events, after a last apply pass."""
    with Consumer(location, RESERVATION) as c:
        c.process_all()
        return {
            "inbox": raw_inbox(location),
            "projections": {f: c.projection(f) for f in flows},
            "applied": {f: [(e.event_id, e.seq, e.kind) for e in c.applied(f)] for f in flows},
        }


def plant(location: str, *envelopes: dict[str, Any], **consumer_kw: Any) -> None:
    """Events that reached the consumer by another way (the conflicts' other side)."""
    with Consumer(location, RESERVATION, **consumer_kw) as c:
        for env in envelopes:
            assert c.receive(env).status == "accepted"


class Stepped:
    """The consumer in process, as a Worker drives it: receive-and-apply, then
    an apply pass (what a bridge does after each read)."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer, self.applying = consumer, consumer.applying()
        self.name, self.uid, self.location = consumer.name, consumer.uid, consumer.location

    def accept(self, body: str) -> Any:
        return self.accept_many([body])[0]

    def accept_many(self, bodies: Any) -> Any:
        try:
            return self.applying.accept_many(bodies)
        finally:
            self.consumer.process_all()


def run_both(new_store: Callable[[str], str], redis_url: str, script: Callable[[Producer, Any], Any],
             setup: Callable[[Producer, str], None], consumer_kw: dict[str, Any] | None = None,
             flows: tuple[str, ...] = ("A", "B", "C", "D")) -> tuple[Any, Any]:
    """``script(producer, receiver)`` in process (the consumer's receive-and-apply
    mode, an apply pass after each step as a Worker makes) and through Redis
    (a bridge in a thread, a RedisReceiver): (what each returned, the stores'
    picture)."""
    consumer_kw = consumer_kw or {}
    out = []
    for remote in (False, True):
        p_at, c_at = new_store("producer-remote" if remote else "producer"), new_store(
            "consumer-remote" if remote else "consumer")
        with Producer(p_at, RESERVATION) as producer:
            setup(producer, c_at)
            if remote:
                with serving(c_at, redis_url, consumer_kw=consumer_kw) as b, \
                        RedisReceiver(redis_url, NAME, timeout=10) as receiver:
                    got = script(producer, receiver)
                assert b.stats.errors == 0, b.stats.last_error
                assert b.stats.malformed == 0
            else:
                with Consumer(c_at, RESERVATION, **consumer_kw) as consumer:
                    got = script(producer, Stepped(consumer))
            picture = consumer_picture(c_at, list(flows))
            picture["delivery"] = raw_delivery(p_at)
        out.append((got, picture))
    return out[0], out[1]


# -- 1. the same statuses and rows as in process, on both engines ---------------------------


def _conflicts_setup(producer: Producer, c_at: str) -> None:
    commit(producer, "A", 3)
    commit(producer, "B", 1)
    commit(producer, "C", 1)
    commit(producer, "D", 1)
    plant(c_at, envelope("C1", "C", 1, amount=9), envelope("X1", "D", 1))


def _conflicts_script(producer: Producer, receiver: Any) -> list[tuple[Any, ...]]:
    got = [shown(relay(producer, receiver, event_id="A2")),  # behind a gap: stored, not applied
           shown(relay(producer, receiver, event_id="A1")),  # applied on arrival, A2 once the gap fills
           shown(relay(producer, receiver, event_id="A1"))]  # re-sent: duplicate
    while (r := relay(producer, receiver)).status != "idle":
        got.append(shown(r))
    got.append(shown(relay(producer, receiver, event_id="C1")))  # still a conflict, still not marked
    return got


def test_statuses_and_rows_as_in_process(new_store: Any, redis_url: str) -> None:
    local, remote = run_both(new_store, redis_url, _conflicts_script, _conflicts_setup)
    assert remote == local
    got, picture = remote
    assert got == [
        ("accepted", "A2", "A", 2, False, False),
        ("accepted", "A1", "A", 1, True, False),
        ("duplicate", "A1", "A", 1, False, False),
        ("accepted", "A3", "A", 3, True, False),
        ("accepted", "B1", "B", 1, True, False),
        ("id_conflict", "C1", "C", 1, False, True),
        ("sequence_conflict", "D1", "D", 1, False, True),
        ("id_conflict", "C1", "C", 1, False, True),
    ]
    assert picture["applied"]["A"] == [("A1", 1, "reserved"), ("A2", 2, "confirmed"), ("A3", 3, "released")]
    assert [(row[0], row[4]) for row in picture["inbox"]] == [
        ("A1", "applied"), ("A2", "applied"), ("A3", "applied"), ("B1", "applied"), ("C1", "applied"),
        ("X1", "applied")]
    assert [row[1:] for row in picture["delivery"]] == [
        ("A1", "accepted", "duplicate", 2), ("A2", "accepted", "accepted", 1), ("A3", "accepted", "accepted", 1),
        ("B1", "accepted", "accepted", 1), ("C1", "set_aside", "id_conflict", 2),
        ("D1", "set_aside", "sequence_conflict", 1)]


def _full_setup(producer: Producer, c_at: str) -> None:
    commit(producer, "A", 2)
    commit(producer, "B", 2)
    plant(c_at)  # the store made, nothing in it


def _full_script(producer: Producer, receiver: Any) -> list[tuple[Any, ...]]:
    return [shown(relay(producer, receiver, event_id=e)) for e in ("A2", "B2", "A1", "B2")] + [
        shown(r) for r in relay_batch(producer, receiver, 10).results]


def test_refused_when_the_inbox_is_full_as_in_process(new_store: Any, redis_url: str) -> None:
    local, remote = run_both(new_store, redis_url, _full_script, _full_setup, consumer_kw={"max_inbox": 1})
    assert remote == local
    got, picture = remote
    assert got == [
        ("accepted", "A2", "A", 2, False, False),
        ("refused", "B2", "B", 2, False, True),  # behind a gap while A2 waits: no room
        ("accepted", "A1", "A", 1, True, False),  # the gap fills: A1 and A2 applied, room again
        ("accepted", "B2", "B", 2, False, False),
        ("accepted", "B1", "B", 1, True, False),  # (the batch)
    ]
    assert [(row[1], row[2], row[3], row[4]) for row in picture["delivery"]] == [
        ("A1", "accepted", "accepted", 1), ("A2", "accepted", "accepted", 1),
        ("B1", "accepted", "accepted", 1), ("B2", "accepted", "accepted", 2)]
    assert picture["applied"]["B"] == [("B1", 1, "reserved"), ("B2", 2, "confirmed")]
    assert "B2" in [row[1] for row in picture["delivery"] if row[2] == "pending" or row[3] == "accepted"]


@pytest.mark.parametrize("limit", [1, 10, 100])
def test_relay_batch_as_in_process(new_store: Any, redis_url: str, limit: int) -> None:
    flows = [f"F{i:02d}" for i in range(50)]

    def setup(producer: Producer, c_at: str) -> None:
        with producer.batch() as b:
            for f in flows:
                for seq in (1, 2):
                    b.advance(f"{f}-{seq}", f, expected_seq=seq - 1, kind=("reserved", "confirmed")[seq - 1],
                              payload={"amount": 3})
        plant(c_at)

    def script(producer: Producer, receiver: Any) -> list[Any]:
        sizes = []
        while not (batch := relay_batch(producer, receiver, limit)).idle:
            sizes.append((len(batch.results), dict(batch.counts), sum(r.applied for r in batch.results)))
        return sizes

    local, remote = run_both(new_store, redis_url, script, setup, flows=tuple(flows))
    assert remote == local
    sizes, picture = remote
    assert sum(n for n, _c, _a in sizes) == 100
    assert len(sizes) == 100 // limit
    assert sum(a for _n, _c, a in sizes) == 100  # every event applied on arrival
    assert len(picture["inbox"]) == 100
    assert all(row[4] == "applied" for row in picture["inbox"])


def test_worker_relays_through_redis_until_idle(new_store: Any, redis_url: str) -> None:
    c_at = new_store("consumer")
    plant(c_at)
    with Producer(new_store("producer"), RESERVATION) as producer:
        for f in ("A", "B", "C", "D", "E"):
            commit(producer, f, 3)
        with serving(c_at, redis_url) as b, RedisReceiver(redis_url, NAME, timeout=10) as receiver:
            worker = Worker(producer, [receiver], relay_batch=7, idle_sleep=0.05)
            stats = worker.run(until_idle=True, handle_signals=False)
            assert dict(stats.relayed) == {"accepted": 15}
            assert stats.applied == 15  # applied at the bridge, on arrival
            assert (stats.errors, stats.last_error) == (0, None)
            again = Worker(producer, [receiver]).run(until_idle=True, handle_signals=False)
            assert (dict(again.relayed), again.applied) == ({}, 0)
        assert b.stats.requests == b.stats.answered == 3  # 7 + 7 + 1
        assert dict(b.stats.received) == {"accepted": 15}
        assert (b.stats.applied, b.stats.malformed, b.stats.expired, b.stats.reclaimed) == (15, 0, 0, 0)
        assert all(e.accepted for e in producer.outbox())
    picture = consumer_picture(c_at, ["A", "B", "C", "D", "E"])
    assert all(p == {"state": "released", "last_seq": 3, "held": 0} for p in picture["projections"].values())
    assert len(picture["inbox"]) == 15


# -- 2. failure semantics -------------------------------------------------------------------


def test_no_bridge_is_a_failed_send_then_a_bridge_answers(tmp_path: Path, redis_url: str) -> None:
    c_at = str(tmp_path / "consumer.db")
    with serving(c_at, redis_url):
        pass  # announced, then gone
    with Producer(str(tmp_path / "producer.db"), RESERVATION) as producer, \
            RedisReceiver(redis_url, NAME, timeout=0.5) as receiver:
        commit(producer, "A", 1)
        started = time.monotonic()
        with pytest.raises(TransportError, match="no answer") as failed:
            relay(producer, receiver)
        assert time.monotonic() - started >= 0.5
        assert redis_url in str(failed.value)
        e = outbox_entry(producer, "A1")
        assert (e.accepted, e.state, e.last_status) == (False, "pending", None)
        d = e.deliveries[NAME]
        assert d.attempts == 1
        assert (d.last_error or "").startswith("TransportError: ")
        assert rows(c_at, "SELECT count(*) FROM inbox") == [(0,)]
        with serving(c_at, redis_url) as b:
            r = relay(producer, receiver, event_id="A1")  # the explicit relay skips the backoff
            assert (str(r.status), r.event_id, r.applied) == ("accepted", "A1", True)
        assert b.stats.expired == 1  # the first request, read after its deadline: dropped unread
        assert dict(b.stats.received) == {"accepted": 1}
        e = outbox_entry(producer, "A1")
        assert (e.accepted, e.deliveries[NAME].attempts) == (True, 2)
    assert [(row[0], row[4]) for row in raw_inbox(c_at)] == [("A1", "applied")]


class SlowBridge(Bridge):
    """Writes its first answer ``delay`` seconds late."""

    delay = 0.9

    def _finish(self, answers: Any, done: Any) -> None:
        if not getattr(self, "_slowed", False) and answers:
            self._slowed = True
            time.sleep(self.delay)
        super()._finish(answers, done)


def test_an_answer_after_its_deadline_is_ignored(tmp_path: Path, redis_url: str) -> None:
    c_at = str(tmp_path / "consumer.db")
    with Producer(str(tmp_path / "producer.db"), RESERVATION) as producer, \
            serving(c_at, redis_url, cls=SlowBridge) as b, RedisReceiver(redis_url, NAME, timeout=0.5) as receiver:
        commit(producer, "A", 2)
        with pytest.raises(TransportError, match="no answer"):
            relay(producer, receiver)  # stored and applied over there, but answered too late
        assert outbox_entry(producer, "A1").accepted is False
        assert receiver.ignored == 0
        r = relay(producer, receiver, event_id="A1")
        assert (str(r.status), r.event_id) == ("duplicate", "A1")
        assert receiver.ignored == 1  # the late answer came first on the reply stream
        assert outbox_entry(producer, "A1").accepted is True
        assert str(relay(producer, receiver).status) == "accepted"
        assert receiver.ignored == 1
    assert dict(b.stats.received) == {"accepted": 2, "duplicate": 1}
    assert b.stats.applied == 2
    picture = consumer_picture(c_at, ["A"])
    assert picture["applied"]["A"] == [("A1", 1, "reserved"), ("A2", 2, "confirmed")]


def test_another_store_under_the_name_is_a_mismatch(tmp_path: Path, redis_url: str) -> None:
    first, second = str(tmp_path / "first.db"), str(tmp_path / "second.db")
    with Producer(str(tmp_path / "producer.db"), RESERVATION) as producer, \
            RedisReceiver(redis_url, NAME, timeout=5) as old:
        commit(producer, "A", 2)
        with serving(first, redis_url):
            assert str(relay(producer, old).status) == "accepted"
        before = raw_delivery(producer.location)
        with serving(second, redis_url) as b:  # the same name, another store
            # the old receiver still sends for the first store's uid: the bridge refuses it
            with pytest.raises(ConsumerMismatch, match="its own name"):
                relay(producer, old, event_id="A2")
            # a new receiver reads the second store's uid: the producer refuses to send
            with RedisReceiver(redis_url, NAME, timeout=5) as new, pytest.raises(ConsumerMismatch):
                relay(producer, new, event_id="A2")
        assert (b.stats.requests, b.stats.answered, dict(b.stats.received)) == (1, 1, {})
        assert raw_inbox(second) == []
        assert [row for row in raw_delivery(producer.location) if row[1] == "A1"] == \
            [row for row in before if row[1] == "A1"]
        assert outbox_entry(producer, "A2").accepted is False
        assert [row[0] for row in raw_inbox(first)] == ["A1"]


# -- 3. a bridge that dies between the inbox commit and the acknowledgement ------------------


class Crash(BaseException):
    """The process dies here (nothing catches it)."""


class CrashingBridge(Bridge):
    """Dies after its first inbox commit, before answering and acknowledging."""

    def _finish(self, answers: Any, done: Any) -> None:
        if self.stats.received:
            raise Crash("killed between the commit and the ack")
        super()._finish(answers, done)


@pytest.mark.parametrize("second", ["same-name", "other-name"])
def test_a_bridge_dead_after_the_commit_is_served_again(tmp_path: Path, redis_url: str, client: Any,
                                                        second: str) -> None:
    c_at = str(tmp_path / "consumer.db")
    with Producer(str(tmp_path / "producer.db"), RESERVATION) as producer, \
            RedisReceiver(redis_url, NAME, timeout=5) as receiver:
        commit(producer, "A", 2)
        got: list[Any] = []

        def after_the_crash() -> None:  # the bridge is gone: a new one comes up
            dying.thread.join(20)
            got.append(BridgeThread(c_at, redis_url, name="b1" if second == "same-name" else "b2",
                                    claim_after=0.2).start())

        dying = BridgeThread(c_at, redis_url, cls=CrashingBridge, name="b1").start()
        helper = threading.Thread(target=after_the_crash)
        helper.start()
        try:
            r = relay(producer, receiver)  # answered by the second bridge, from the inbox
        finally:
            helper.join(20)
            for b in got:
                b.stop()
        assert isinstance(dying.error, Crash)
        assert (str(r.status), r.event_id) == ("duplicate", "A1")
        assert outbox_entry(producer, "A1").accepted is True
        new = got[0]
        assert dict(new.stats.received) == {"duplicate": 1}
        assert new.stats.reclaimed == (1 if second == "other-name" else 0)
        assert new.stats.applied == 0
        assert dying.stats.applied == 1
    assert client.xpending(REQUESTS, GROUP)["pending"] == 0
    picture = consumer_picture(c_at, ["A"])
    assert picture["applied"]["A"] == [("A1", 1, "reserved")]  # once
    assert [(row[0], row[4]) for row in picture["inbox"]] == [("A1", "applied")]


# -- 4. Redis restarted empty -----------------------------------------------------------------


def test_redis_restarted_empty(tmp_path: Path, redis_server: Any, redis_url: str, client: Any) -> None:
    c_at = str(tmp_path / "consumer.db")
    with Producer(str(tmp_path / "producer.db"), RESERVATION) as producer, \
            serving(c_at, redis_url) as b, RedisReceiver(redis_url, NAME, timeout=2) as receiver:
        commit(producer, "A", 3)
        commit(producer, "B", 3)
        assert str(relay(producer, receiver).status) == "accepted"
        redis_server.kill()
        redis_server.restart()
        assert client.exists(ANNOUNCED, REQUESTS) == 0  # all forgotten
        statuses, failures = [], 0
        deadline = time.monotonic() + 20
        while not all(e.accepted for e in producer.outbox()):
            assert time.monotonic() < deadline, (statuses, failures, b.stats.as_dict())
            try:
                pending = [e.event_id for e in producer.outbox() if not e.accepted]
                statuses.append(str(relay(producer, receiver, event_id=pending[0]).status))
            except TransportError:
                failures += 1
        assert set(statuses) == {"accepted"}
        assert failures <= 3
        assert client.hget(ANNOUNCED, "uid").decode() == receiver.uid  # announced again
        assert [g["name"].decode() for g in client.xinfo_groups(REQUESTS)] == [GROUP]  # the group made anew
        with RedisReceiver(redis_url, NAME, timeout=2) as fresh:  # a worker started now finds it
            assert fresh.uid == receiver.uid
    picture = consumer_picture(c_at, ["A", "B"])
    assert picture["applied"] == {f: [(f"{f}{n}", n, k) for n, k in
                                      zip((1, 2, 3), ("reserved", "confirmed", "released"))] for f in "AB"}


# -- 5. bad input on the streams ---------------------------------------------------------------


def _body(event_id: str, flow: str = "Z", seq: int = 1) -> str:
    return canonical_body(envelope(event_id, flow, seq))


def _request(**changes: Any) -> dict[str, Any]:
    # Made when the module is imported (BAD_REQUESTS), possibly minutes before the test runs
    # under xdist: the deadline must outlive that, or a request whose only fault is in its
    # bodies is dropped as expired (unread) instead of refused as malformed.
    fields: dict[str, Any] = {"v": "1", "id": wire.new_id(), "reply": "rf:{default}:answers:hand",
                              "deadline": repr(time.time() + 3600), "uid": "?", "bodies": json.dumps([_body("Z1")])}
    fields.update(changes)
    return {k: v for k, v in fields.items() if v is not None}


BAD_REQUESTS = [
    ({"foo": "bar"}, "v"),
    ({b"v": b"\xff\xfe"}, "v"),
    (_request(v="2"), "v"),
    (_request(deadline="nan"), "deadline"),
    (_request(deadline="inf"), "deadline"),
    (_request(deadline="soon"), "deadline"),
    (_request(bodies="{not json"), "bodies"),
    (_request(bodies='{"a": 1}'), "bodies"),
    (_request(bodies="[]"), "bodies"),
    (_request(bodies="[1]"), "bodies[0]"),
    (_request(bodies=json.dumps([_body(f"Z{i}") for i in range(wire.MAX_BODIES + 1)])), "bodies"),
    (_request(bodies=json.dumps(["x" * (16 * 1024 + 1)])), "bodies[0]"),
    (_request(bodies=json.dumps(['{"a":1}'])), "bodies[0]"),
    (_request(bodies=json.dumps([_body("Z1"), "[1,2]"])), "bodies[1]"),
    (_request(reply="rf:{other}:answers:x"), "reply"),
    (_request(id=None), "id"),
]


def test_bad_requests_are_refused_recorded_and_never_block(tmp_path: Path, redis_url: str, client: Any) -> None:
    c_at = str(tmp_path / "consumer.db")
    with Producer(str(tmp_path / "producer.db"), RESERVATION) as producer, \
            serving(c_at, redis_url) as b, RedisReceiver(redis_url, NAME, timeout=5) as receiver:
        commit(producer, "A", 1)
        uid = receiver.uid
        for fields, _field in BAD_REQUESTS:
            if "uid" in fields:
                fields = {**fields, "uid": uid}  # only the named field is wrong
            client.xadd(REQUESTS, fields)
        r = relay(producer, receiver)  # behind every bad one
        assert (str(r.status), r.event_id, r.applied) == ("accepted", "A1", True)
        eventually(lambda: b.stats.malformed == len(BAD_REQUESTS), what="all refused")
    assert b.stats.requests == len(BAD_REQUESTS) + 1
    assert dict(b.stats.received) == {"accepted": 1}
    refused = client.xrange(REFUSED)
    assert len(refused) == len(BAD_REQUESTS)
    for (_id, entry), (_fields, field) in zip(refused, BAD_REQUESTS):
        assert entry[b"error"].decode().startswith(f"{field}: "), (entry, field)
    assert client.xlen(REQUESTS) == 0  # acknowledged and gone
    assert client.xpending(REQUESTS, GROUP)["pending"] == 0
    assert [row[0] for row in raw_inbox(c_at)] == ["A1"]  # never Z1
    # the ones with a reply address and an id of this consumer were answered with the error
    answers = client.xrange("rf:{default}:answers:hand")
    assert len(answers) == sum(1 for fields, _ in BAD_REQUESTS
                               if fields.get("id") and fields.get("reply") == "rf:{default}:answers:hand") == 12
    for _id, entry in answers:
        answer = wire.parse_answer(wire.decode(entry))
        with pytest.raises(RemoteError) as info:
            answer.outcome()
        assert info.value.remote_type == "InvalidEnvelope"


def test_a_malformed_request_from_a_sender_is_answered_with_the_error(tmp_path: Path, redis_url: str) -> None:
    c_at = str(tmp_path / "consumer.db")
    with serving(c_at, redis_url) as b, RedisReceiver(redis_url, NAME, timeout=5) as receiver:
        with pytest.raises(RemoteError, match="bodies\\[1\\]") as info:
            receiver.accept_many([_body("Z1"), '{"event_id": "Z2"}'])
        assert info.value.remote_type == "InvalidEnvelope"
        assert isinstance(info.value, TransportError)  # a failed send for the relay
        assert [str(r.status) for r in receiver.accept_many([_body("Z1")])] == ["accepted"]
    assert b.stats.malformed == 1
    assert [row[0] for row in raw_inbox(c_at)] == ["Z1"]


def test_bad_answers_on_a_reply_stream_are_ignored(tmp_path: Path, redis_url: str, client: Any) -> None:
    c_at = str(tmp_path / "consumer.db")
    with Producer(str(tmp_path / "producer.db"), RESERVATION) as producer, \
            serving(c_at, redis_url), RedisReceiver(redis_url, NAME, timeout=5) as receiver:
        commit(producer, "A", 1)
        reply = receiver._reply
        good_row = ["accepted", "A1", "A", 1, None, True]
        for fields in [
            {"foo": "bar"},
            {"v": "1", "id": "x", "uid": receiver.uid, "results": "nope"},
            {"v": "1", "id": "x", "uid": receiver.uid, "results": json.dumps([[*good_row[:3], True, None, True]])},
            {"v": "1", "id": "x", "uid": receiver.uid, "results": json.dumps([["won", *good_row[1:]]])},
            {"v": "1", "id": "x", "uid": receiver.uid, "results": json.dumps([[*good_row[:5], "yes"]])},
            {"v": "9", "id": "x", "uid": receiver.uid, "results": json.dumps([good_row])},
        ]:
            client.xadd(reply, fields)
        r = relay(producer, receiver)
        assert (str(r.status), r.event_id) == ("accepted", "A1")
        assert receiver.ignored == 6
        assert outbox_entry(producer, "A1").accepted is True


# -- 6. bad arguments ----------------------------------------------------------------------


@pytest.mark.parametrize("url", ["http://x", "", None, "unix://", "redis://"])
def test_a_wrong_url_is_a_value_error_naming_it(tmp_path: Path, url: Any) -> None:
    with pytest.raises(ValueError, match="url"):
        RedisReceiver(url, NAME)
    with Consumer(str(tmp_path / "c.db"), RESERVATION) as consumer, pytest.raises(ValueError, match="url"):
        Bridge(consumer, url)


def test_an_unreachable_server_is_a_transport_error_naming_it(tmp_path: Path) -> None:
    url = "redis://127.0.0.1:1/0"
    with Consumer(str(tmp_path / "c.db"), RESERVATION) as consumer, \
            pytest.raises(TransportError, match="redis://127.0.0.1:1/0"):
        Bridge(consumer, url)
    with Producer(str(tmp_path / "p.db"), RESERVATION) as producer, \
            RedisReceiver(url, NAME, timeout=0.5) as receiver:
        commit(producer, "A", 1)
        with pytest.raises(TransportError, match="redis://127.0.0.1:1/0"):
            relay(producer, receiver)
        with pytest.raises(TransportError, match="redis://127.0.0.1:1/0"):
            receiver.accept(_body("A1", "A"))
        assert outbox_entry(producer, "A1").accepted is False
        assert receiver.location.endswith(f"via {url}")


def test_a_password_is_not_shown() -> None:
    with RedisReceiver("redis://:s3cret@127.0.0.1:1/0", NAME, timeout=0.5) as receiver, \
            pytest.raises(TransportError) as info:
        receiver.accept(_body("A1", "A"))
    assert "s3cret" not in str(info.value)
    assert "***" in str(info.value)


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), True, "1"])
def test_a_bad_timeout_is_named(timeout: Any) -> None:
    with pytest.raises((ValueError, TypeError), match="timeout"):
        RedisReceiver("redis://127.0.0.1:1/0", NAME, timeout=timeout)


@pytest.mark.parametrize("name", ["", None, 5, "a\x00b", "x" * 129])
def test_a_bad_consumer_name_is_named(name: Any) -> None:
    with pytest.raises((ValueError, TypeError), match="consumer_name"):
        RedisReceiver("redis://127.0.0.1:1/0", name)


@pytest.mark.parametrize("value", ["", 5, "a\x00b", "x" * 129])
def test_a_bad_prefix_or_bridge_name_is_a_value_error_naming_it(tmp_path: Path, value: Any) -> None:
    """No envelope field: a plain ValueError naming the argument, not InvalidEnvelope."""
    with pytest.raises(ValueError, match="prefix") as info:
        RedisReceiver("redis://127.0.0.1:1/0", NAME, prefix=value)
    assert not isinstance(info.value, InvalidEnvelope)
    with Consumer(str(tmp_path / "c.db"), RESERVATION) as consumer:
        for option in ("prefix", "name"):
            with pytest.raises(ValueError, match=option) as info:
                Bridge(consumer, "redis://127.0.0.1:1/0", **{option: value})
            assert not isinstance(info.value, InvalidEnvelope)


def test_the_bridge_parses_each_body_once(tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from reliable_flow import _envelope
    from reliable_flow.transport.redis import _bridge

    parsed: list[str] = []
    real = _envelope.parse

    def counting(body: Any) -> Any:
        parsed.append(body)
        return real(body)

    monkeypatch.setattr(_envelope, "parse", counting)
    monkeypatch.setattr(_bridge, "parse_body", counting)
    bodies = [_body("Z1"), _body("Z2", seq=2)]
    with serving(str(tmp_path / "consumer.db"), redis_url), RedisReceiver(redis_url, NAME, timeout=5) as receiver:
        assert [str(r.status) for r in receiver.accept_many(bodies)] == ["accepted", "accepted"]
    assert sorted(parsed) == sorted(bodies)


def test_an_async_worker_relays_through_redis_as_a_worker_does(new_store: Any, redis_url: str) -> None:
    c_at, p_at = new_store("consumer"), new_store("producer")
    plant(c_at)
    with Producer(p_at, RESERVATION) as producer:
        for f in ("A", "B", "C"):
            commit(producer, f, 3)

    async def main(receiver: RedisReceiver) -> WorkerStats:
        async with AsyncProducer(p_at, RESERVATION) as producer:
            worker = AsyncWorker(producer, [receiver], relay_batch=7, idle_sleep=0.05)
            return await worker.run(until_idle=True, handle_signals=False)

    with serving(c_at, redis_url) as b, RedisReceiver(redis_url, NAME, timeout=10) as receiver:
        stats = asyncio.run(main(receiver))
    assert (dict(stats.relayed), stats.applied, stats.errors) == ({"accepted": 9}, 9, 0)  # applied at the bridge
    assert b.stats.requests == b.stats.answered == 2  # 7 + 2
    with Producer(p_at, RESERVATION) as producer:
        assert all(e.accepted for e in producer.outbox())


def test_bad_bridge_arguments_are_named(tmp_path: Path, redis_url: str) -> None:
    with Consumer(str(tmp_path / "c.db"), RESERVATION) as consumer:
        for option, value in [("claim_after", 0), ("block", float("nan")), ("batch", 0), ("name", ""),
                              ("apply_limit", -1), ("apply_on_receive", "yes")]:
            with pytest.raises((ValueError, TypeError), match=option):
                Bridge(consumer, redis_url, **{option: value})
        with pytest.raises(TypeError, match="consumer"):
            Bridge("c.db", redis_url)  # type: ignore[arg-type]


# -- 7. the command line ---------------------------------------------------------------------


def test_cli_bridge_and_run_to_move_events_end_to_end(tmp_path: Path, redis_url: str, client: Any) -> None:
    p_at, c_at = str(tmp_path / "producer.db"), str(tmp_path / "consumer.db")
    with Producer(p_at, RESERVATION) as producer:
        for f in ("A", "B", "C", "D"):
            commit(producer, f, 3)
    bridge_args = [sys.executable, "-m", "reliable_flow", "bridge", c_at, "--redis", redis_url,
                   "--report-every", "0"]
    with child_process(bridge_args, cwd=tmp_path, env=child_env()) as proc:
        eventually(lambda: client.hget(ANNOUNCED, "uid") or proc.poll() is not None, what="announced")
        assert proc.poll() is None, proc.communicate()
        done = run_cli("run", "--producer", p_at, "--to", redis_url, "--consumer", NAME, "--until-idle",
                       cwd=tmp_path, env=child_env(), timeout=60)
        assert done.returncode == 0, done.stderr
        stats = json.loads(done.stderr.rsplit("run: stopped: ", 1)[1])
        assert stats["relayed"] == {"accepted": 12}
        proc.terminate()
        _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    bridge_stats = json.loads(err.rsplit("bridge: stopped: ", 1)[1])
    assert bridge_stats["received"] == {"accepted": 12}
    assert bridge_stats["applied"] == 12
    picture = consumer_picture(c_at, ["A", "B", "C", "D"])
    assert all(p == {"state": "released", "last_seq": 3, "held": 0} for p in picture["projections"].values())
    with Producer(p_at, RESERVATION) as producer:
        assert all(e.accepted for e in producer.outbox())


def test_cli_bridge_once_serves_what_waits(tmp_path: Path, redis_url: str, client: Any) -> None:
    p_at, c_at = str(tmp_path / "producer.db"), str(tmp_path / "consumer.db")
    with Producer(p_at, RESERVATION) as producer:
        commit(producer, "A", 3)
    with Consumer(c_at, RESERVATION) as consumer, Bridge(consumer, redis_url):
        pass  # announced once, so that a worker can send before a bridge serves
    worker = [sys.executable, "-m", "reliable_flow", "run", "--producer", p_at, "--to", redis_url,
              "--consumer", NAME, "--once"]
    with child_process(worker, cwd=tmp_path, env=child_env()) as proc:
        eventually(lambda: client.xlen(REQUESTS) or proc.poll() is not None, what="a request sent")
        served = run_cli("bridge", c_at, "--redis", redis_url, "--once", cwd=tmp_path, env=child_env())
        assert served.returncode == 0, served.stderr
        _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
    assert json.loads(err.rsplit("run: stopped: ", 1)[1])["relayed"] == {"accepted": 3}
    assert [(row[0], row[4]) for row in raw_inbox(c_at)] == [("A1", "applied"), ("A2", "applied"),
                                                             ("A3", "applied")]


def test_a_bridge_pass_says_what_it_did_and_to_come_back_at_once(tmp_path: Path, redis_url: str) -> None:
    with Consumer(str(tmp_path / "consumer.db"), RESERVATION) as consumer, \
            Bridge(consumer, redis_url, block=0.05) as bridge:
        assert bridge.run_once() == PassResult(0, 0.0)  # the next pass waits for requests itself
        with RedisReceiver(redis_url, NAME, timeout=5) as receiver:
            sent = threading.Thread(target=receiver.accept_many, args=([_body("Z1"), _body("Z2", seq=2)],))
            sent.start()
            done = eventually(lambda: bridge.run_once().work, what="the requests answered")
            sent.join(timeout=10)
        assert done >= 1 and consumer.projection("Z") is not None


def test_cli_unreachable_server_and_misplaced_options(tmp_path: Path) -> None:
    url = "redis://127.0.0.1:1/0"
    p_at = str(tmp_path / "producer.db")
    Producer(p_at, RESERVATION).close()
    bridge = run_cli("bridge", str(tmp_path / "c.db"), "--redis", url, cwd=tmp_path, env=child_env())
    assert bridge.returncode == 2
    assert url in bridge.stderr and bridge.stderr.startswith("bridge: ")
    run = run_cli("run", "--producer", p_at, "--to", url, "--consumer", NAME, "--until-idle",
                  cwd=tmp_path, env=child_env())
    assert run.returncode == 2
    assert url in run.stderr
    misplaced = run_cli("run", "--producer", p_at, "--to", url, "--consumer", NAME, "--handlers", "x:y",
                        cwd=tmp_path, env=child_env())
    assert misplaced.returncode == 2
    assert "--handlers" in misplaced.stderr


def test_reply_streams_do_not_outlive_their_receiver(tmp_path: Path, redis_url: str, client: Any) -> None:
    c_at = str(tmp_path / "consumer.db")
    with serving(c_at, redis_url), RedisReceiver(redis_url, NAME, timeout=5) as receiver:
        assert [str(r.status) for r in receiver.accept_many([_body("Z1")])] == ["accepted"]
        reply = receiver._reply
    assert client.exists(reply) == 1
    assert 0 < client.ttl(reply) <= 600  # a worker that stops for good leaves no stream behind
