"""Each consumer's own order through the Redis transport (issue 32, item 5):
the order is the consumer's, so what a bridge receives for it obeys it.

Three consumer stores, ``audit`` (strict), ``recent`` (latest) and
``stats`` (any), each served by a :class:`Bridge` in a thread of its own;
their events are sent through a :class:`RedisReceiver` in reverse order
(the bridge applies on arrival), then a :class:`Worker` relays what is
left: the latest consumer applies only the newest state and stores the
older as superseded, the any consumer applies each event once on arrival,
the strict one waits at its gap and applies everything in order once it
is filled.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from engine_reads import new_location
from redis_server import import_redis
from reliable_flow import Consumer, Producer, Protocol, Worker

redis = import_redis()

from reliable_flow.transport.redis import Bridge, RedisReceiver

pytestmark = pytest.mark.redis

STEPS = ("reserved", "confirmed", "released")
#: Each event carries its state (a snapshot; the default step merges it in).
SNAP = Protocol(name="snap", initial="new",
                transitions={"new": ["reserved"], "reserved": ["confirmed"], "confirmed": ["released"]},
                schemas={1: lambda kind, payload: dict(payload)})
WHO = {"actor": "test", "reason": "issue 32 item 5"}
ORDERS = {"audit": "strict", "recent": "latest", "stats": "any"}


@contextmanager
def bridged(location: str, url: str, name: str, order: str) -> Iterator[None]:
    """A bridge serving the consumer store at ``location`` (opened with
    ``order``) from a thread of its own, until the block ends."""
    ready, box = threading.Event(), {}

    def main() -> None:
        try:
            with Consumer(location, SNAP, name=name, order=order) as consumer:
                bridge = Bridge(consumer, url, block=0.05)
                box["bridge"] = bridge
                ready.set()
                try:
                    bridge.run(handle_signals=False)
                finally:
                    bridge.close()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            box["error"] = exc
        finally:
            ready.set()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    assert ready.wait(20), "the bridge did not start"
    try:
        yield
    finally:
        if "bridge" in box:
            box["bridge"].stop()
        thread.join(20)
    assert "error" not in box, box.get("error")


def test_each_order_through_the_transport(engine: str, tmp_path: Path, redis_url: str) -> None:
    stores = {name: new_location(engine, tmp_path, name) for name in ORDERS}
    with Producer(new_location(engine, tmp_path, "p"), SNAP) as p:
        for name in ORDERS:
            p.admin.register_consumer(name, **WHO)
        for flow in ("F", "G"):
            for seq, kind in enumerate(STEPS, start=1):
                p.advance(f"{flow}{seq}", flow, expected_seq=seq - 1, kind=kind, payload={"n": seq})
        with bridged(stores["audit"], redis_url, "audit", "strict"), \
                bridged(stores["recent"], redis_url, "recent", "latest"), \
                bridged(stores["stats"], redis_url, "stats", "any"):
            receivers = [RedisReceiver(redis_url, name, timeout=10) for name in ORDERS]
            try:
                for receiver in receivers:
                    bodies = [b for _, b in p.store.latest.next_due(receiver.name, float("inf"), 100)]
                    answers = [receiver.accept(b) for b in reversed(bodies)]  # newest first
                    assert [a.status for a in answers] == ["accepted"] * 6
                    applied = [a.applied for a in answers]
                    if receiver.name == "recent":  # the newest of each flow, then older ones superseded
                        assert applied == [True, False, False, True, False, False]
                        assert answers[1].reason == "superseded by seq 3"
                    elif receiver.name == "stats":  # each on arrival
                        assert applied == [True] * 6
                    else:  # strict: seq 3 and 2 wait for seq 1
                        assert applied[0] is False
                stats = Worker(p, receivers).run(until_idle=True, handle_signals=False)
                assert set(stats.relayed) <= {"duplicate"}, dict(stats.relayed)
            finally:
                for receiver in receivers:
                    receiver.close()
    for name, order in ORDERS.items():
        with Consumer(stores[name], SNAP, name=name, order=order) as c:
            c.process_all()  # strict: whatever its bridge left behind its gap
            for flow in ("F", "G"):
                seqs = [a.seq for a in c.applied(flow)]
                states = {e.event_id: e.state for e in c.inbox(flow)}
                assert c.projection(flow)["last_seq"] == 3, (name, flow)  # type: ignore[index]
                if order == "strict":
                    assert seqs == [1, 2, 3]
                elif order == "any":
                    assert sorted(seqs) == [1, 2, 3] and seqs == [3, 2, 1]
                else:
                    assert seqs == [3]
                    assert states == {f"{flow}1": "superseded", f"{flow}2": "superseded", f"{flow}3": "applied"}
            assert json.dumps(c.metrics().order) == json.dumps(order)
