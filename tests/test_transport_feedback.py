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

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agent_hosts import ASK, TOOLS, ToolsHost, schedule, until
from redis_server import import_redis
from reliable_flow import (
    Consumer,
    EffectCall,
    EffectExecutor,
    EffectRegistry,
    Feedback,
    Producer,
    Worker,
)
from reliable_flow.aio import AsyncConsumer, AsyncEffectExecutor, AsyncProducer, AsyncWorker
from reliable_flow.errors import InvalidEnvelope, NotResolvable, TransportError, WrongFile

redis = import_redis()

from reliable_flow.transport.redis import RedisReceiver, RemoteProducer
from reliable_flow.transport.redis._producer import producer_location

pytestmark = pytest.mark.redis




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


def test_an_async_executor_feeds_many_results_home_at_once(agent: tuple[Producer, Worker], new_store: Any,
                                                           redis_url: str) -> None:
    producer, worker = agent
    flows = [f"F{i}" for i in range(12)]
    for flow in flows:
        producer.advance(f"{flow}-1", flow, expected_seq=0, kind="asked", payload={"q": flow})
    effects = EffectRegistry()
    effects.register("look_up", lambda call: {"a": call.payload["q"]}, feedback=Feedback(kind="answered"))
    c_at = new_store(TOOLS)
    with Consumer(c_at, ASK, name=TOOLS) as consumer:  # host B's consumer: the asked steps, as a bridge stores them
        for flow in flows:
            consumer.receive(producer.event(f"{flow}-1") or {})
    errors: list[BaseException] = []
    stats: list[Any] = []

    async def tools_host() -> None:
        async with await AsyncConsumer.open(c_at, ASK, name=TOOLS, handlers=[schedule], effects=effects) as c:
            await c.process_all()  # applied: 12 effects scheduled, none fed yet
            ex = AsyncEffectExecutor(c, effects, producer=f"{redis_url}#agent", concurrency=12)
            try:
                await ex.run_once(limit=12)  # all 12 called; their results sent home in one round trip
                await ex.run_until_idle()
                stats.append(ex.stats)
            finally:
                await ex.close()

    def host_b() -> None:
        try:
            asyncio.run(tools_host())
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    worker.run_once()  # 'agent' announced
    thread = threading.Thread(target=host_b, daemon=True)
    thread.start()
    until(lambda: not thread.is_alive(), worker, timeout=30)
    assert not errors, errors
    assert stats[0].fed == 12 and stats[0].feedback_errors == 0
    assert all((producer.flow(f) or {}).get("state") == "answered" for f in flows)
    assert worker.stats.served == {"committed": 12}


def test_an_idle_serving_worker_answers_at_once_not_after_its_idle_sleep(new_store: Any, redis_url: str) -> None:
    answered: list[float] = []
    with RedisReceiver(redis_url, TOOLS, timeout=5) as tools:
        location = new_store("agent")

        def host_a() -> None:
            with Producer(location, ASK) as producer:
                worker = Worker(producer, [tools], register=True, idle_sleep=30, serve_as="agent")
                holder.append(worker)
                worker.run(handle_signals=False)

        holder: list[Worker] = []
        thread = threading.Thread(target=host_a, daemon=True)
        thread.start()
        try:
            with RemoteProducer(redis_url, "agent", timeout=10) as remote:
                end = time.monotonic() + 10
                while True:  # until the worker announced itself
                    try:
                        remote._announced_uid()
                        break
                    except TransportError:
                        assert time.monotonic() < end, "the worker did not announce the producer"
                        time.sleep(0.02)
                time.sleep(0.3)  # the worker is in its idle sleep now
                for i in range(3):
                    start = time.monotonic()
                    result = remote.advance_at_current(f"k{i}:result", f"F{i}", kind="asked", payload={"q": "x"})
                    answered.append(time.monotonic() - start)
                    assert result.status == "committed"
        finally:
            holder[0].stop()
            thread.join(40)
    assert max(answered) < 2.0, answered  # not the 30 s idle sleep


def test_an_idle_async_serving_worker_answers_at_once(new_store: Any, redis_url: str) -> None:
    location = new_store("agent")
    answered: list[float] = []
    errors: list[BaseException] = []
    ready, stop = threading.Event(), threading.Event()

    async def host_a() -> None:
        async with await AsyncProducer.open(location, ASK) as producer:
            with RedisReceiver(redis_url, TOOLS, timeout=5) as tools:
                worker = AsyncWorker(producer, [tools], register=True, idle_sleep=30, serve_as="agent")
                task = asyncio.create_task(worker.run(handle_signals=False))
                ready.set()
                while not stop.is_set():
                    await asyncio.sleep(0.02)
                worker.stop()
                await task

    def run_a() -> None:
        try:
            asyncio.run(host_a())
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    thread = threading.Thread(target=run_a, daemon=True)
    thread.start()
    try:
        assert ready.wait(20)
        with RemoteProducer(redis_url, "agent", timeout=10) as remote:
            end = time.monotonic() + 10
            while True:
                try:
                    remote._announced_uid()
                    break
                except TransportError:
                    assert time.monotonic() < end, "the worker did not announce the producer"
                    time.sleep(0.02)
            time.sleep(0.3)  # idle now
            for i in range(3):
                start = time.monotonic()
                assert remote.advance_at_current(f"k{i}:result", f"F{i}", kind="asked",
                                                 payload={"q": "x"}).status == "committed"
                answered.append(time.monotonic() - start)
    finally:
        stop.set()
        thread.join(40)
    assert not errors, errors
    assert max(answered) < 2.0, answered  # not the 30 s idle sleep


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


def test_an_amend_is_checked_by_the_producer_on_its_host_then_fed_once(agent: tuple[Producer, Worker],
                                                                       new_store: Any, redis_url: str) -> None:
    producer, worker = agent
    effects = EffectRegistry()
    effects.register("look_up", lambda call: {"not_a": 1}, feedback=Feedback(kind="answered"))
    producer.advance("A1", "A", expected_seq=0, kind="asked", payload={"q": "a"})
    c_at = new_store(TOOLS)
    with ToolsHost(c_at, redis_url, effects) as host:  # the result is refused by the protocol
        until(lambda: host.executor is not None and host.executor.stats.feedback_errors >= 1, worker)
    outcomes: list[Any] = []

    def operator(result: Any) -> None:
        with Consumer(c_at, ASK, name=TOOLS, effects=effects) as consumer, \
                RemoteProducer(redis_url, "agent", timeout=10) as remote:
            key = consumer.scheduled_effects()[0].key
            try:
                outcomes.append(consumer.admin.amend_effect(key, result=result, actor="ops", reason="fix",
                                                            producer=remote))
            except Exception as exc:  # noqa: BLE001 - the test looks at it
                outcomes.append(exc)

    for result in ({"b": 1}, {"a": "fixed"}):
        sender = threading.Thread(target=operator, args=(result,))
        sender.start()
        until(lambda s=sender: not s.is_alive(), worker)
    refused, amended = outcomes
    assert isinstance(refused, NotResolvable) and "nothing recorded" in str(refused), refused
    assert amended.action == "resolve" and amended.reason.startswith("amend:")
    assert [e.event_id for e in producer.outbox("A")] == ["A1"]  # the checks committed nothing
    assert worker.stats.served["checked"] == 2
    with ToolsHost(c_at, redis_url, effects) as host:  # the next pass feeds the amended result, once
        until(lambda: (producer.flow("A") or {}).get("state") == "answered", worker)
    assert [e.seq for e in producer.outbox("A")] == [1, 2]
    assert (producer.event(producer.outbox("A")[1].event_id) or {})["payload"] == {"a": "fixed"}


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


def _advance_request(**changes: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {"v": "1", "id": "hand", "reply": "rf:{producer:agent}:answers:hand",
                              "deadline": repr(time.time() + 3600), "uid": "?", "event_id": "k:result",
                              "flow_id": "A", "kind": "answered", "schema": "1", "payload": '{"a": "x"}',
                              "meta": "{}"}
    fields.update(changes)
    return {k: v for k, v in fields.items() if v is not None}


BAD_ADVANCES = [
    {"foo": "bar"}, _advance_request(v="2"), _advance_request(deadline="nan"), _advance_request(schema="0"),
    _advance_request(schema="true"), _advance_request(payload="{not json"), _advance_request(meta="[1]"),
    _advance_request(meta='{"a": 1}'), _advance_request(check="2"), _advance_request(event_id=None),
    _advance_request(reply="rf:{producer:other}:answers:x"),
]


def test_bad_advance_requests_are_refused_and_never_block(agent: tuple[Producer, Worker], redis_url: str,
                                                          client: Any) -> None:
    producer, worker = agent
    producer.advance("A1", "A", expected_seq=0, kind="asked", payload={"q": "a"})
    worker.run_once()  # announced: the group exists
    for fields in BAD_ADVANCES:
        client.xadd("rf:{producer:agent}:requests", {**fields, "uid": producer.uid} if "uid" in fields else fields)
    results: list[Any] = []

    def send() -> None:  # behind every bad one
        with RemoteProducer(redis_url, "agent", timeout=10) as remote:
            results.append(remote.advance_at_current("k:result", "A", kind="answered", payload={"a": "x"}))

    sender = threading.Thread(target=send)
    sender.start()
    until(lambda: not sender.is_alive(), worker)
    assert [r.status for r in results] == ["committed"]
    assert worker.stats.served == {"malformed": len(BAD_ADVANCES), "committed": 1}
    assert [e.event_id for e in producer.outbox("A")] == ["A1", "k:result"]
    answered = client.xrange("rf:{producer:agent}:answers:hand")
    assert len(answered) == len(BAD_ADVANCES) - 2  # all but the two without a reply address of this producer
    assert client.xlen("rf:{producer:agent}:requests") == 0  # every one acknowledged and dropped


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


@pytest.mark.parametrize(("option", "value"), [("batch", 0), ("batch", True), ("batch", 1.5),
                                               ("claim_after", float("nan")), ("claim_after", float("inf")),
                                               ("claim_after", 0), ("claim_after", True)])
def test_a_bad_server_option_is_a_value_error_naming_it(new_store: Any, redis_url: str, option: str,
                                                        value: Any) -> None:
    from reliable_flow.transport.redis import ProducerServer

    with Producer(new_store("p"), ASK) as producer, pytest.raises((ValueError, TypeError), match=option):
        ProducerServer(producer, redis_url, "agent", **{option: value})


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
