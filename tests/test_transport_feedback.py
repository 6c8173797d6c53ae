"""Results and failures come home across hosts (issue 30, item 1), against a
real ``redis-server`` and real stores on both engines.

An executor beside a consumer feeds results into a producer it cannot open
(``producer="redis://...#agent"``, a :class:`RemoteProducer`); the worker that
relays from the producer serves it (``Worker(..., serve_as="agent")``) and
advances each step there under the rules of a local feedback: the event id
derived from the effect's key, one producer transaction at the flow's current
seq, ``existing`` on a retry, a step the protocol refuses recorded as refused
feedback with its reason.  Failure windows: nobody serving (a transport error,
nothing taken as fed), another producer store under the name (``WrongFile``),
bad locations and names (``ValueError`` naming the argument).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from redis_server import import_redis
from reliable_flow import (
    ApplyContext,
    Consumer,
    EffectCall,
    EffectExecutor,
    EffectRegistry,
    Feedback,
    Producer,
    Worker,
)
from reliable_flow.errors import InvalidEnvelope, TransportError, WrongFile
from reliable_flow.protocol import Protocol, by_kind, exact, text

redis = import_redis()

from reliable_flow.transport.redis import Bridge, RedisReceiver, RemoteProducer
from reliable_flow.transport.redis._producer import producer_location

pytestmark = pytest.mark.redis

ASK = Protocol(
    name="ask", initial="new",
    transitions={"new": ["asked"], "asked": ["answered"]},
    schemas={1: by_kind({"asked": exact({"q": text()}), "answered": exact({"a": text()})})},
)
TOOLS = "tools"


def _schedule(ctx: ApplyContext) -> None:
    if ctx.event.kind == "asked":
        ctx.schedule("look_up", {"q": ctx.event.payload["q"]})


class ToolsHost:
    """Host B: a bridge serving the ``tools`` consumer, whose executor feeds
    results into the remote producer ``agent``; in a thread of its own (a
    Consumer belongs to the thread that opened it)."""

    def __init__(self, location: str, url: str, effects: EffectRegistry) -> None:
        self.location, self.url, self.effects = location, url, effects
        self.error: BaseException | None = None
        self.bridge: Bridge | None = None
        self.executor: EffectExecutor | None = None
        self._ready = threading.Event()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        try:
            with Consumer(self.location, ASK, name=TOOLS, handlers=[_schedule], effects=self.effects) as consumer:
                self.executor = EffectExecutor(consumer, producer=f"{self.url}#agent")
                self.bridge = Bridge(consumer, self.url, executors=[self.executor], block=0.05)
                self._ready.set()
                try:
                    self.bridge.run(handle_signals=False)
                finally:
                    self.bridge.close()
                    self.executor.close()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            self.error = exc
        finally:
            self._ready.set()

    def __enter__(self) -> ToolsHost:  # noqa: PYI034 - Self needs Python 3.11
        self.thread.start()
        assert self._ready.wait(20), "host B did not start"
        if self.error is not None:
            raise self.error
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bridge is not None:
            self.bridge.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "host B did not stop"
        if self.error is not None:
            raise self.error


def until(check: Callable[[], Any], worker: Worker, timeout: float = 20.0) -> Any:
    """Worker passes (host A) until ``check()`` is truthy."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        worker.run_once()
        got = check()
        if got:
            return got
        time.sleep(0.01)
    raise AssertionError(f"not reached within {timeout} s; worker: {worker.stats.as_dict()}")


@pytest.fixture
def client(redis_url: str) -> Iterator[Any]:
    """A plain Redis client on the test's (emptied) server."""
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


@pytest.fixture
def agent(new_store: Any, redis_url: str) -> Iterator[tuple[Producer, Worker]]:
    """Host A: the agent's producer and the worker that relays from it and serves it as ``agent``."""
    with Producer(new_store("agent"), ASK) as producer, RedisReceiver(redis_url, TOOLS, timeout=5) as tools:
        yield producer, Worker(producer, [tools], register=True, idle_sleep=0, serve_as="agent")


def test_a_result_comes_home_through_the_transport_once(agent: tuple[Producer, Worker], new_store: Any,
                                                        redis_url: str) -> None:
    producer, worker = agent
    calls: list[str] = []

    def look_up(call: EffectCall) -> dict[str, str]:
        calls.append(call.flow_id)
        return {"a": call.payload["q"].upper()}

    effects = EffectRegistry()
    effects.register("look_up", look_up, feedback=Feedback(kind="answered"))
    for flow in ("A", "B"):
        producer.advance(f"{flow}1", flow, expected_seq=0, kind="asked", payload={"q": flow.lower()})
    with ToolsHost(new_store(TOOLS), redis_url, effects) as host:
        until(lambda: all((producer.flow(f) or {}).get("state") == "answered" for f in "AB"), worker)
        assert host.executor is not None and host.executor.stats.fed == 2
    assert sorted(calls) == ["A", "B"]
    for flow in ("A", "B"):
        state = producer.flow(flow)
        assert state is not None and state["state"] == "answered" and state["seq"] == 2
        events = producer.outbox(flow)
        assert [e.seq for e in events] == [1, 2] and events[1].event_id.endswith(":result")
        assert (producer.event(events[1].event_id) or {})["payload"] == {"a": flow}
    assert worker.stats.served == {"committed": 2}
    assert worker.stats.as_dict()["served"] == {"committed": 2}


def test_a_retried_step_is_existing_and_a_refused_one_stores_nothing(agent: tuple[Producer, Worker],
                                                                      redis_url: str) -> None:
    producer, worker = agent
    producer.advance("A1", "A", expected_seq=0, kind="asked", payload={"q": "a"})
    results: list[Any] = []

    def send(**step: Any) -> None:
        with RemoteProducer(redis_url, "agent", timeout=10) as remote:
            results.append(remote.advance_at_current(**step))

    for step in ({"event_id": "k:result", "flow_id": "A", "kind": "answered", "payload": {"a": "x"}},
                 {"event_id": "k:result", "flow_id": "A", "kind": "answered", "payload": {"a": "x"}},
                 {"event_id": "k:result", "flow_id": "A", "kind": "answered", "payload": {"a": "y"}},
                 {"event_id": "k2:result", "flow_id": "C", "kind": "asked", "payload": {"no": 1}}):
        worker.run_once()  # announced before the first request
        sender = threading.Thread(target=send, kwargs=step)
        sender.start()
        until(lambda s=sender: not s.is_alive(), worker)
    assert [r.status for r in results] == ["committed", "existing", "conflict", "invalid_payload"]
    assert results[0].seq == results[1].seq == results[2].seq == 2 and results[3].seq is None
    assert "payload" in (results[2].reason or "") and "payload.no" in (results[3].reason or "")
    assert [e.event_id for e in producer.outbox("A")] == ["A1", "k:result"]
    assert worker.stats.served == {"committed": 1, "existing": 1, "conflict": 1, "invalid_payload": 1}


def test_a_step_that_is_no_envelope_is_refused_by_name(agent: tuple[Producer, Worker], redis_url: str) -> None:
    producer, worker = agent
    errors: list[Exception] = []

    def send() -> None:
        with RemoteProducer(redis_url, "agent", timeout=10) as remote:
            try:
                remote.advance_at_current("k:result", "A\x00B", kind="answered", payload={"a": "x"})
            except Exception as exc:  # noqa: BLE001 - the test looks at it
                errors.append(exc)

    worker.run_once()
    sender = threading.Thread(target=send)
    sender.start()
    until(lambda: not sender.is_alive(), worker)
    assert len(errors) == 1 and isinstance(errors[0], InvalidEnvelope) and errors[0].field == "flow_id", errors
    assert producer.flows() == [] and worker.stats.served == {"refused": 1}


def test_a_protocol_refusal_is_recorded_as_refused_feedback(agent: tuple[Producer, Worker], new_store: Any,
                                                            redis_url: str) -> None:
    producer, worker = agent
    effects = EffectRegistry()
    effects.register("look_up", lambda call: {"not_a": 1}, feedback=Feedback(kind="answered"))
    producer.advance("A1", "A", expected_seq=0, kind="asked", payload={"q": "a"})
    with ToolsHost(new_store(TOOLS), redis_url, effects) as host:
        until(lambda: host.executor is not None and host.executor.stats.feedback_errors >= 1, worker)
        assert host.executor is not None and host.executor.stats.fed == 0
        last = host.executor.stats.last_error or ""
    assert "feedback invalid_payload: payload.not_a" in last, last
    assert [e.event_id for e in producer.outbox("A")] == ["A1"]


def test_nobody_serving_is_a_transport_error_and_nothing_is_fed(redis_url: str) -> None:
    with RemoteProducer(redis_url, "nobody", timeout=0.3) as remote, \
            pytest.raises(TransportError, match="nobody serves it"):
        remote.advance_at_current("k:result", "A", kind="answered", payload={"a": "x"})


def test_another_producer_store_under_the_name_is_refused(agent: tuple[Producer, Worker], new_store: Any,
                                                          redis_url: str, client: Any) -> None:
    producer, worker = agent
    worker.run_once()  # 'agent' announced by the first store
    remote = RemoteProducer(redis_url, "agent", timeout=10)
    first_uid = remote._announced_uid()  # what a sender learnt before the name changed hands
    with Producer(new_store("other"), ASK) as other, RedisReceiver(redis_url, TOOLS, timeout=5) as tools:
        impostor = Worker(other, [tools], register=True, idle_sleep=0, serve_as="agent")
        with pytest.raises(WrongFile, match="two producer stores are served under one name"):
            impostor.run_once()  # the name is announced for another store lately: not served
        client.delete("rf:{producer:agent}:producer")  # as after the first one's silence, or Redis restarted
        results: list[Any] = []

        def send() -> None:
            try:
                remote.advance_at_current("k:result", "A", kind="answered", payload={"a": "x"})
            except Exception as exc:  # noqa: BLE001 - the test looks at it
                results.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        until(lambda: not sender.is_alive(), impostor)
        assert other.outbox() == [] and producer.outbox("A") == [] and other.uid != first_uid
    remote.close()
    assert len(results) == 1 and isinstance(results[0], WrongFile), results
    assert "two producer stores are served under one name" in str(results[0])


@pytest.mark.parametrize("location", ["redis://h:1/0", "agent", "http://h#agent", "redis://h:1/0#", "", 3])
def test_a_bad_remote_location_is_a_value_error_naming_producer(location: Any) -> None:
    with pytest.raises(ValueError, match="producer"):
        producer_location(location)


def test_serve_as_needs_a_transport_and_a_name(new_store: Any, redis_url: str) -> None:
    with Producer(new_store("p"), ASK) as producer, Consumer(new_store("c"), ASK) as consumer:
        with pytest.raises(ValueError, match="serve_as"):
            Worker(producer, [consumer], register=True, serve_as="agent")
        with RedisReceiver(redis_url, TOOLS) as tools:
            for bad in ("", 3, "a\nb"):
                with pytest.raises(ValueError, match="serve_as"):
                    Worker(producer, [tools], register=True, serve_as=bad)  # type: ignore[arg-type]


def test_an_executor_refuses_a_producer_that_is_neither(new_store: Any) -> None:
    with Consumer(new_store("c"), ASK) as consumer:
        with pytest.raises(TypeError, match="producer"):
            EffectExecutor(consumer, EffectRegistry(), producer=3)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="producer"):
            EffectExecutor(consumer, EffectRegistry(), producer="agent.db")



def test_a_result_comes_home_while_the_worker_waits_on_the_bridge(new_store: Any, redis_url: str,
                                                                   client: Any) -> None:
    # The bridge's executor feeds A's result and waits for the worker's answer, while the worker's
    # relay of B waits for the bridge's: the worker serves its producer meanwhile, so neither waits
    # out its timeout (before, both did: every round trip took up to the worker's send timeout).
    effects = EffectRegistry()
    effects.register("look_up", lambda call: {"a": call.payload["q"].upper()}, feedback=Feedback(kind="answered"))
    with Producer(new_store("agent"), ASK) as producer, RedisReceiver(redis_url, TOOLS, timeout=8) as tools:
        worker = Worker(producer, [tools], register=True, idle_sleep=0, serve_as="agent")
        producer.advance("A1", "A", expected_seq=0, kind="asked", payload={"q": "a"})
        with ToolsHost(new_store(TOOLS), redis_url, effects):
            until(lambda: producer.outbox("A")[0].deliveries[TOOLS].state == "accepted", worker)
            # No pass of the worker now: the bridge runs A's call and waits in its feed.
            end = time.monotonic() + 5
            while client.xlen("rf:{producer:agent}:requests") == 0 and time.monotonic() < end:
                time.sleep(0.01)
            assert client.xlen("rf:{producer:agent}:requests") == 1
            producer.advance("B1", "B", expected_seq=0, kind="asked", payload={"q": "b"})
            began = time.monotonic()
            work, _more = worker.relay_step(0, worker.stats)  # B's relay waits for the bridge
            took = time.monotonic() - began
            assert work > 0 and producer.outbox("B")[0].deliveries[TOOLS].state == "accepted", worker.stats
            assert (producer.flow("A") or {}).get("state") == "answered"
            until(lambda: (producer.flow("B") or {}).get("state") == "answered", worker)
        assert took < 4.0, f"B's relay took {took:.1f} s (the send timeout is 8 s)"
        assert worker.stats.served == {"committed": 2}, worker.stats.served
