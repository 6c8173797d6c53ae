"""Observability: the component loggers and their structured fields, ``meta``
on inbox rows, the metrics snapshots (``Producer.metrics()``,
``Consumer.metrics()``, ``reliable-flow metrics`` with ``--prometheus``), and
the optional OpenTelemetry spans (``reliable_flow.tracing``).  The store tests
run on both engines (the ``at`` fixture); the spans test's child script on
SQLite files."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import reliable_flow
from engine_reads import contents, is_pg, store_exists
from reliable_flow import (
    ApplyContext,
    Consumer,
    DeliveryPolicy,
    EffectExecutor,
    EffectRegistry,
    OutcomeUnknown,
    PermanentFailure,
    Producer,
    Worker,
    relay,
    snapshot,
    tracing,
)
from reliable_flow.metrics import ConsumerMetrics, DeliveryMetrics, ProducerMetrics, prometheus_text
from reliable_flow.reservation import RESERVATION
from support import TESTS, Clock, Unreachable, child_env, run_cli

At = Callable[[str], str]  # the ``at`` fixture of conftest.py: a store location by label, on the test's engine

META = {"correlation_id": "corr-7", "causation_id": "cause-3", "trace": "t-1"}
LOGGERS = ("producer", "relay", "consumer", "executor", "worker")


def records(caplog: pytest.LogCaptureFixture, component: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == f"reliable_flow.{component}"]


def by_status(caplog: pytest.LogCaptureFixture, component: str, status: str) -> list[logging.LogRecord]:
    return [r for r in records(caplog, component) if getattr(r, "status", None) == status]


# -- logging --------------------------------------------------------------------------------


def test_every_component_has_its_named_logger_and_the_library_prints_nothing_by_itself() -> None:
    from reliable_flow import _observe as observe

    assert [lg.name for lg in (observe.PRODUCER, observe.RELAY, observe.CONSUMER, observe.EXECUTOR,
                               observe.WORKER)] == [f"reliable_flow.{c}" for c in LOGGERS]
    handlers = logging.getLogger("reliable_flow").handlers
    assert [type(h) for h in handlers] == [logging.NullHandler]


def test_records_carry_the_ids_and_the_meta_as_fields(at: At, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="reliable_flow")
    with Producer(at("p"), RESERVATION) as producer, Consumer(at("c"), RESERVATION) as consumer:
        producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}, meta=META)
        relay(producer, consumer)
        consumer.apply_next("A")
    fields = {"event_id": "A1", "flow_id": "A", "seq": 1, **META}
    [committed] = by_status(caplog, "producer", "committed")
    assert {k: getattr(committed, k) for k in fields} == fields
    assert committed.consumer is None and committed.levelno == logging.INFO
    for component, status in (("relay", "accepted"), ("consumer", "accepted"), ("consumer", "applied")):
        [record] = by_status(caplog, component, status)
        # The consumer side has the correlation ids from the stored meta.
        assert {k: getattr(record, k) for k in fields} == fields, (component, status)
        assert record.consumer == "default" and record.levelno == logging.INFO
        assert "event_id=A1" in record.getMessage() and "correlation_id=corr-7" in record.getMessage()


def test_an_event_without_meta_has_the_meta_fields_as_none(at: At, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="reliable_flow")
    with Producer(at("p"), RESERVATION) as producer, Consumer(at("c"), RESERVATION) as consumer:
        producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
        relay(producer, consumer)
        consumer.drain("A")
    [applied] = by_status(caplog, "consumer", "applied")
    assert (applied.event_id, applied.correlation_id, applied.causation_id, applied.trace) == ("A1", None, None, None)


def _effects(calls: list[str]) -> EffectRegistry:
    effects = EffectRegistry()
    effects.register("notify", lambda call: calls.append(call.key) or {"sent": True})
    return effects


def _notify(ctx: ApplyContext) -> None:
    ctx.schedule("notify", {"flow": ctx.event.flow_id})


def test_a_clean_run_logs_nothing_at_warning(at: At, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="reliable_flow")
    calls: list[str] = []
    with Producer(at("p"), RESERVATION) as producer, \
            Consumer(at("c"), RESERVATION, handlers=[_notify], effects=_effects(calls)) as consumer:
        for flow in "AB":
            producer.advance(f"{flow}1", flow, expected_seq=0, kind="reserved", payload={"amount": 3}, meta=META)
            producer.advance(f"{flow}2", flow, expected_seq=1, kind="confirmed", payload={"amount": 3})
        worker = Worker(producer, [consumer], executors=[EffectExecutor(consumer)], idle_sleep=0)
        worker.run(until_idle=True, handle_signals=False)  # an effect call ends on a later pass
        assert worker.stats.applied == 4 and len(calls) == 4
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert len(by_status(caplog, "executor", "succeeded")) == 4
    [first] = [r for r in by_status(caplog, "executor", "succeeded") if r.event_id == "A1"]
    assert (first.key, first.correlation_id, first.consumer) == ("default:A1:notify", "corr-7", "default")


def test_problems_are_warnings_and_a_repeated_block_is_only_debug(
    at: At, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="reliable_flow")
    with Producer(at("p"), RESERVATION) as producer, Consumer(at("c"), RESERVATION) as consumer:
        producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
        producer.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"units": 3}, schema=2, meta=META)
        producer.advance("C1", "C", expected_seq=0, kind="reserved", payload={"amount": 1})
        consumer.receive({"event_id": "C1", "flow_id": "C", "seq": 1, "kind": "reserved", "schema": 1,
                          "payload": {"amount": 9}})
        assert producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 4}).status == "conflict"
        for event_id in ("A1", "A2", "C1"):
            relay(producer, consumer, event_id=event_id)
        consumer.process_all()
        consumer.process_all()  # the same block, found again
    warnings = [(r.name, r.status, r.event_id) for r in caplog.records if r.levelno == logging.WARNING]
    assert sorted(warnings) == [
        ("reliable_flow.consumer", "blocked", "A2"),
        ("reliable_flow.consumer", "id_conflict", "C1"),
        ("reliable_flow.producer", "conflict", "A1"),
        ("reliable_flow.relay", "id_conflict", "C1"),
    ]
    blocked = by_status(caplog, "consumer", "blocked")
    assert [r.levelno for r in blocked] == [logging.WARNING, logging.DEBUG]
    assert (blocked[0].reason, blocked[0].correlation_id) == ("unsupported_schema", "corr-7")
    assert "schema 2" in blocked[0].detail


def test_a_gap_names_the_waiting_event_and_its_meta(at: At, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="reliable_flow")
    with Producer(at("p"), RESERVATION) as producer, Consumer(at("c"), RESERVATION) as consumer:
        producer.advance("B1", "B", expected_seq=0, kind="reserved", payload={"amount": 3})
        producer.advance("B2", "B", expected_seq=1, kind="confirmed", payload={"amount": 3}, meta=META)
        relay(producer, consumer, event_id="B2")
        assert consumer.apply_next("B").status == "gap"
    [gap] = by_status(caplog, "consumer", "gap")
    assert (gap.flow_id, gap.seq, gap.waiting_event_id, gap.waiting_seq, gap.correlation_id) == (
        "B", 1, "B2", 2, "corr-7")


def test_failed_sends_effect_trouble_operator_actions_and_worker_errors_are_logged(
    at: At, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reliable_flow")
    clock = Clock()
    effects = EffectRegistry()
    effects.register("charge", lambda call: (_ for _ in ()).throw(PermanentFailure("card declined")))
    # Two producers, each with its one consumer.
    with Producer(at("p"), RESERVATION) as producer, \
            Consumer(at("c"), RESERVATION, handlers=[lambda ctx: ctx.schedule("charge", {})],
                     effects=effects, clock=clock) as consumer, \
            Producer(at("p2"), RESERVATION) as producer2, \
            Unreachable(at("down"), RESERVATION, name="down") as down:
        for p in (producer, producer2):
            p.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}, meta=META)
        with pytest.raises(ConnectionError):
            relay(producer2, down)
        relay(producer, consumer)
        consumer.drain("A")
        EffectExecutor(consumer, policy=DeliveryPolicy(lease_seconds=30, clock=clock)).run_once()
        consumer.admin.cancel_effect("default:A1:charge", actor="ops", reason="refunded by hand")
        producer2.admin.skip("A1", consumer="down", actor="ops", reason="down for good")
        down_worker = Worker(producer2, [down], idle_sleep=0)
        down_worker.run_once()  # nothing pending for down now: no error
        assert records(caplog, "worker") == []
        down.open_flows = lambda: (_ for _ in ()).throw(RuntimeError("disk on fire"))  # type: ignore[method-assign]
        down_worker.run_once()
    [failed] = [r for r in records(caplog, "relay") if r.status == "failed"]
    assert (failed.levelno, failed.consumer, failed.event_id, failed.correlation_id) == (
        logging.WARNING, "down", "A1", "corr-7")
    assert "consumer unreachable" in failed.error
    [dead] = by_status(caplog, "executor", "dead")
    assert (dead.levelno, dead.key, dead.event_id, dead.correlation_id) == (
        logging.WARNING, "default:A1:charge", "A1", "corr-7")
    actions = [(r.name, r.status, r.actor, r.reason) for r in caplog.records if r.getMessage().startswith("operator")]
    assert actions == [("reliable_flow.consumer", "cancel", "ops", "refunded by hand"),
                       ("reliable_flow.producer", "skip", "ops", "down for good")]
    [error] = records(caplog, "worker")
    assert error.levelno == logging.WARNING and "disk on fire" in error.error and error.where == "down"


def test_with_info_off_the_hot_path_builds_no_record(
    at: At, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Default levels (WARNING): a clean advance / relay / apply / effect run
    builds no field dict at all; the control shows the stub does fire."""
    from reliable_flow import _observe as observe
    from reliable_flow import _worker as worker
    from reliable_flow._effects import step as executor

    built: list[str] = []

    def counting(*args: Any, **kwargs: Any) -> dict[str, Any]:
        built.append(str(kwargs.get("status", args[3] if len(args) > 3 else None)))
        return {}

    for module in (observe, executor, worker):
        monkeypatch.setattr(module, "fields", counting)
    caplog.set_level(logging.WARNING, logger="reliable_flow")
    calls: list[str] = []
    with Producer(at("p"), RESERVATION) as producer, \
            Consumer(at("c"), RESERVATION, handlers=[_notify], effects=_effects(calls)) as consumer:
        producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}, meta=META)
        with producer.batch() as batch:
            batch.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"amount": 3})
        relay(producer, consumer)
        relay(producer, consumer)
        relay(producer, consumer, event_id="A1")  # a duplicate: INFO, not built either
        consumer.apply_next("A")
        consumer.process_all()
        EffectExecutor(consumer).run_once()
        assert len(calls) == 2 and built == []
        caplog.set_level(logging.INFO, logger="reliable_flow")  # the control
        producer.advance("A3", "A", expected_seq=2, kind="released", payload={"amount": 3})
    assert built == ["committed"]


# -- meta on inbox rows ----------------------------------------------------------------------


def _troubled(at: At) -> tuple[str, str]:
    """A: A1 applied, A2 blocked (schema 2, with meta); B: B2 waits at a gap
    (with meta); C1 set aside; D1 never relayed; E1 applied with effects
    succeeded, dead, unknown and pending; A1 received twice."""
    clock = Clock(1000.0)
    p_path, c_path = at("producer"), at("consumer")
    effects = EffectRegistry()
    effects.register("ok", lambda call: {"done": True})
    effects.register("bad", lambda call: (_ for _ in ()).throw(PermanentFailure("no")))
    effects.register("maybe", lambda call: (_ for _ in ()).throw(OutcomeUnknown("timed out")))
    effects.register("later", lambda call: {"done": True})

    def handler(ctx: ApplyContext) -> None:
        if ctx.event.flow_id == "E":
            for name in ("ok", "bad", "maybe", "later"):
                ctx.schedule(name, {})

    with Producer(p_path, RESERVATION) as producer, \
            Consumer(c_path, RESERVATION, handlers=[handler], effects=effects, clock=clock) as consumer:
        producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
        producer.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"units": 3}, schema=2,
                         meta={"correlation_id": "order-42"})
        producer.advance("B1", "B", expected_seq=0, kind="reserved", payload={"amount": 2})
        producer.advance("B2", "B", expected_seq=1, kind="confirmed", payload={"amount": 2},
                         meta={"correlation_id": "order-43"})
        producer.advance("C1", "C", expected_seq=0, kind="reserved", payload={"amount": 1})
        producer.advance("E1", "E", expected_seq=0, kind="reserved", payload={"amount": 1})
        consumer.receive({"event_id": "C1", "flow_id": "C", "seq": 1, "kind": "reserved", "schema": 1,
                          "payload": {"amount": 9}})
        for event_id in ("A1", "A2", "B2", "C1", "E1", "A1"):
            relay(producer, consumer, event_id=event_id)
        consumer.process_all()
        executor = EffectExecutor(consumer, effects, policy=DeliveryPolicy(lease_seconds=30, clock=clock,
                                                                           random=lambda: 0.5))
        # later stays pending: only the other three are taken up now.
        limited = EffectRegistry()
        for name in ("ok", "bad", "maybe"):
            spec = effects.get(name)
            assert spec is not None
            limited.register(name, spec.run)
        executor = EffectExecutor(consumer, limited, policy=executor.policy)
        executor.run_once()
        clock.t += 3600  # maybe: in doubt, no reconcile -> parked as unknown when due again
        executor.run_once()
        producer.advance("D1", "D", expected_seq=0, kind="reserved", payload={"amount": 1})
    return p_path, c_path


def test_inbox_rows_carry_their_meta_to_readers_snapshot_and_inspect(at: At) -> None:
    p_path, c_path = _troubled(at)
    seen: list[dict[str, str]] = []
    with Consumer(c_path, RESERVATION, schemas={1, 2}, handlers=[lambda ctx: seen.append(ctx.event.meta)],
                  effects=EffectRegistry()) as consumer:
        assert [(r.event_id, r.meta) for r in consumer.inbox("A")] == [
            ("A1", {}), ("A2", {"correlation_id": "order-42"})]
    snap = snapshot(p_path, c_path)
    assert snap["consumer"]["inbox"]["B"] == [
        {"event_id": "B2", "seq": 2, "state": "pending", "reason": None, "meta": {"correlation_id": "order-43"}}]
    done = run_cli("inspect", str(p_path), str(c_path), "--json")
    assert done.returncode == 1, done.stderr  # something needs attention: a block and a gap
    report = json.loads(done.stdout)["consumer"]
    assert [(b["event_id"], b["meta"]) for b in report["blocked"]] == [("A2", {"correlation_id": "order-42"})]
    assert [(g["flow_id"], g["waiting"], g["meta"]) for g in report["gaps"]] == [
        ("B", [2], [{"correlation_id": "order-43"}])]
    text = run_cli("inspect", str(p_path), str(c_path)).stdout
    assert "reason=unsupported_schema  meta={'correlation_id': 'order-42'}" in text
    with Consumer(c_path, RESERVATION, schemas={1, 2}, handlers=[lambda ctx: seen.append(dict(ctx.event.meta))],
                  effects=EffectRegistry()) as upgraded:
        upgraded.drain("A")
    assert seen == [{"correlation_id": "order-42"}]  # the handler sees the stored meta


def test_the_experiment_output_keeps_its_frozen_shape() -> None:
    done = run_cli("experiment", "--check", timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


# -- metrics ---------------------------------------------------------------------------------


def test_metrics_count_pending_set_aside_blocked_gaps_and_effects(at: At) -> None:
    p_path, c_path = _troubled(at)
    with Producer(p_path, RESERVATION) as producer, Consumer(c_path, RESERVATION) as consumer:
        p = producer.metrics(now=5000.0)
        c = consumer.metrics()
        assert c.duplicates == 0 and c.applied == 0  # a new object: nothing counted in this process yet
        relay(producer, consumer, event_id="A1")
        assert consumer.metrics().duplicates == 1
    assert isinstance(p, ProducerMetrics) and (p.at, p.events, p.flows, p.unbound_events) == (5000.0, 7, 5, 0)
    # A1 sent twice (one retry); B1 and D1 never sent; C1 set aside.
    assert p.consumers == {"default": DeliveryMetrics(pending=2, accepted=4, set_aside=1, skipped=0, retries=1,
                                                      failing=0, leased=0, untried=2, oldest_pending_age=None)}
    assert isinstance(c, ConsumerMetrics) and c.consumer == "default"
    # A1, C1 (the consumer's own, conflicting) and E1 applied; A2 blocked; B2 at a gap.
    assert c.inbox == {"pending": 1, "blocked": 1, "applied": 3, **{s: 0 for s in c.inbox if s not in (
        "pending", "blocked", "applied")}}
    assert (c.blocked, c.gaps) == ({"unsupported_schema": 1}, 1)
    assert {s: n for s, n in c.effects.items() if n} == {"succeeded": 1, "dead": 1, "unknown": 1, "pending": 1}
    assert c.as_dict()["effects"]["unknown"] == 1


def test_failing_leased_and_oldest_pending_age(at: At) -> None:
    class Died(BaseException):
        """The relay's process "dies" mid-send: nothing is recorded, the lease stays."""

    clock = Clock(1000.0)
    with Producer(at("p"), RESERVATION) as producer, \
            Unreachable(at("down"), RESERVATION, name="down") as down:
        for flow in "AB":
            producer.advance(f"{flow}1", flow, expected_seq=0, kind="reserved", payload={"amount": 1})
        failing = DeliveryPolicy(clock=clock, random=lambda: 0.5, backoff_base=1000)
        for _ in range(2):  # A1 fails twice: one retry, failing
            with pytest.raises(ConnectionError):
                relay(producer, down, event_id="A1", policy=failing)
            clock.t += 10
        down.exc = lambda n: Died()
        with pytest.raises(Died):  # B1 (A1 backs off for long): claimed at 1020, lease until 1050
            relay(producer, down, policy=DeliveryPolicy(lease_seconds=30, clock=clock))
        m = producer.metrics(now=1040.0).consumers["down"]
        assert (m.pending, m.retries, m.failing, m.leased, m.untried) == (2, 1, 1, 1, 1)
        assert m.oldest_pending_age == pytest.approx(30.0)  # A1 last written at 1010
        assert producer.metrics(now=1051.0).consumers["down"].leased == 0


def test_applied_per_second_is_counted_since_the_object_was_opened(at: At) -> None:
    with Producer(at("p"), RESERVATION) as producer, Consumer(at("c"), RESERVATION) as consumer:
        for flow in "ABC":
            producer.advance(f"{flow}1", flow, expected_seq=0, kind="reserved", payload={"amount": 1})
            relay(producer, consumer)
        assert consumer.apply_next("A").status == "applied"
        consumer.process_all(batch_size=2)
        consumer.apply_next("A")  # idle: not counted
        m = consumer.metrics()
    assert m.applied == 3 and m.seconds_open is not None and m.seconds_open > 0
    assert m.applied_per_second == pytest.approx(3 / m.seconds_open, rel=0.5)


def test_duplicates_are_counted_through_receive_and_receive_many(at: At) -> None:
    with Producer(at("p"), RESERVATION) as producer, Consumer(at("c"), RESERVATION) as consumer:
        for flow in "AB":
            producer.advance(f"{flow}1", flow, expected_seq=0, kind="reserved", payload={"amount": 1})
        bodies = [json.dumps(producer.event(e)) for e in ("A1", "B1")]
        assert [r.status for r in consumer.receive_many(bodies) if r] == ["accepted", "accepted"]
        consumer.receive_many(bodies)
        consumer.receive(bodies[0])
        assert consumer.metrics().duplicates == 3
    with Consumer(at("c"), RESERVATION) as reopened:
        assert reopened.metrics().duplicates == 0  # in-process only: a new object starts at 0


# -- the metrics command and the Prometheus format ---------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{((?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*)\})? '
                     r'(-?[0-9.e+-]+|NaN|[+-]Inf)$')


def parse_prometheus(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """A strict reader of the text format: every sample is under its own
    ``# HELP`` and ``# TYPE`` lines, names and labels are well formed."""
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    helped: set[str] = set()
    typed: dict[str, str] = {}
    current = None
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split()[2]
            assert name not in helped, f"second HELP for {name}"
            helped.add(name)
            current = name
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name == current and kind in ("gauge", "counter"), line
            typed[name] = kind
        else:
            found = _SAMPLE.match(line)
            assert found, f"not a sample line: {line!r}"
            name, labels, value = found.groups()
            assert name == current and name in typed, f"{name} outside its family"
            assert typed[name] != "counter" or name.endswith("_total"), name
            pairs = frozenset(re.findall(r'([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"', labels or ""))
            assert (name, pairs) not in samples, f"duplicate sample {line!r}"
            samples[(name, pairs)] = float(value)
    return samples


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def test_metrics_command_text_json_and_prometheus_read_only(at: At) -> None:
    p_path, c_path = _troubled(at)
    before = (contents(p_path), contents(c_path))
    text = run_cli("metrics", str(p_path), str(c_path))
    assert text.returncode == 0, text.stderr
    assert "producer: 7 events, 5 flows" in text.stdout
    assert "to 'default': pending 2 (untried 2, leased 0, failing 0, oldest pending age -), accepted 4, " \
           "set_aside 1, skipped 0, retries 1" in text.stdout
    assert "consumer 'default': inbox pending 1, blocked 1, applied 3" in text.stdout
    assert "flows at a gap 1" in text.stdout and "blocked by reason: unsupported_schema 1" in text.stdout
    as_json = json.loads(run_cli("metrics", str(p_path), str(c_path), "--json").stdout)
    assert as_json["consumer"]["duplicates"] is None  # not stored: only a running process counts it
    assert as_json["producer"]["consumers"]["default"]["set_aside"] == 1
    prom = run_cli("metrics", str(p_path), str(c_path), "--prometheus")
    assert prom.returncode == 0, prom.stderr
    samples = parse_prometheus(prom.stdout)
    assert value(samples, "reliable_flow_outbox_events") == 7
    assert value(samples, "reliable_flow_deliveries", consumer="default", state="pending") == 2
    assert value(samples, "reliable_flow_deliveries", consumer="default", state="set_aside") == 1
    assert value(samples, "reliable_flow_delivery_retries", consumer="default") == 1
    assert value(samples, "reliable_flow_inbox_blocked", consumer="default", reason="unsupported_schema") == 1
    assert value(samples, "reliable_flow_flows_at_gap", consumer="default") == 1
    assert value(samples, "reliable_flow_effects", consumer="default", state="unknown") == 1
    assert value(samples, "reliable_flow_effects", consumer="default", state="dead") == 1
    assert not any(name == "reliable_flow_applied_total" for name, _ in samples)  # in-process only
    assert (contents(p_path), contents(c_path)) == before


def test_metrics_command_refuses_missing_or_swapped_files(at: At) -> None:
    p_path, c_path = _troubled(at)
    swapped = run_cli("metrics", str(c_path), str(p_path))
    thing = "store" if is_pg(p_path) else "file"
    assert swapped.returncode == 2 and f"not a producer {thing}" in swapped.stderr
    absent = at("absent")
    missing = run_cli("metrics", str(p_path), absent, "--prometheus")
    assert missing.returncode == 2 and absent.rpartition("#")[2] in missing.stderr  # the file, or the schema
    assert not store_exists(absent)


def test_prometheus_text_escapes_labels_and_includes_live_counts() -> None:
    consumer = ConsumerMetrics(0.0, 'we"ird\\name', {"pending": 1}, {}, 0, {"unknown": 2}, duplicates=3,
                               applied=4, seconds_open=2.0, applied_per_second=2.0)
    samples = parse_prometheus(prometheus_text([consumer]))
    assert value(samples, "reliable_flow_duplicates_received_total", consumer='we\\"ird\\\\name') == 3
    assert value(samples, "reliable_flow_applied_total", consumer='we\\"ird\\\\name') == 4
    assert value(samples, "reliable_flow_applied_per_second", consumer='we\\"ird\\\\name') == 2.0
    producer = ProducerMetrics(0.0, 1, 1, 0, {"c": DeliveryMetrics(pending=1, oldest_pending_age=1.5)})
    samples = parse_prometheus(prometheus_text([producer, consumer]))
    assert value(samples, "reliable_flow_oldest_pending_age_seconds", consumer="c") == 1.5


def test_the_prometheus_reader_rejects_a_malformed_exposition() -> None:
    with pytest.raises(AssertionError):
        parse_prometheus("reliable_flow_x 1\n")  # no HELP / TYPE
    with pytest.raises(AssertionError):
        parse_prometheus('# HELP a x\n# TYPE a gauge\na{l="1} 1\n')


# -- tracing ---------------------------------------------------------------------------------


def _otel_importable() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import opentelemetry.sdk.trace"], env=child_env(),
                           capture_output=True, check=False)
    return probe.returncode == 0


def test_without_opentelemetry_tracing_is_off_and_costs_nothing() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", textwrap.dedent("""
            import importlib.util, sys
            import reliable_flow
            from reliable_flow import tracing, Consumer, Producer, relay
            print(tracing.ACTIVE, importlib.util.find_spec("opentelemetry") is not None,
                  any(m.startswith("opentelemetry") for m in sys.modules),
                  hasattr(Consumer.apply_next, "__wrapped__"), hasattr(relay, "__wrapped__"))
        """)],
        env=child_env(RELIABLE_FLOW_OTEL="0"), capture_output=True, text=True, check=False,
    )
    active, installed, imported, wrapped_apply, wrapped_relay = probe.stdout.split()
    assert (active, imported, wrapped_apply, wrapped_relay) == ("False", "False", "False", "False"), probe.stderr
    if installed == "False":
        assert tracing.ACTIVE is False and not hasattr(reliable_flow.Consumer.apply_next, "__wrapped__")


_SPANS_CHILD = """
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

from reliable_flow import Consumer, EffectExecutor, EffectRegistry, Producer, relay, tracing
from reliable_flow.reservation import RESERVATION

effects = EffectRegistry()
effects.register("notify", lambda call: {"ok": True})
producer = Producer(sys.argv[1] + "/p.db", RESERVATION)
consumer = Consumer(sys.argv[1] + "/c.db", RESERVATION, effects=effects,
                    handlers=[lambda ctx: ctx.schedule("notify", {})])
producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
relay(producer, consumer)
consumer.apply_next("A")
EffectExecutor(consumer).run_once()
print(json.dumps([tracing.ACTIVE] + [[s.name, dict(s.attributes)] for s in exporter.get_finished_spans()]))
"""


def _traced_child(tmp_path: Path, script_text: str) -> Any:
    """Run ``script_text`` (with the SDK) in a child process on ``tmp_path``; what it printed, as JSON."""
    if not _otel_importable():
        pytest.skip('opentelemetry-sdk is not installed: pip install -e ".[test]"')
    script = tmp_path / "traced_child.py"
    script.write_text(script_text, encoding="utf-8")
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], env=child_env(), capture_output=True,
                          text=True, check=False, cwd=TESTS)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_with_opentelemetry_spans_wrap_advance_relay_apply_and_effects(tmp_path: Path) -> None:
    active, *spans = _traced_child(tmp_path, _SPANS_CHILD)
    assert active is True
    named = {name: attrs for name, attrs in spans}
    assert named["reliable_flow.advance"]["reliable_flow.status"] == "committed"
    assert named["reliable_flow.relay"]["reliable_flow.event_id"] == "A1"
    assert named["reliable_flow.relay"]["reliable_flow.status"] == "accepted"
    assert named["reliable_flow.apply"]["reliable_flow.flow_id"] == "A"
    assert named["reliable_flow.apply"]["reliable_flow.status"] == "applied"
    assert named["reliable_flow.effect"]["reliable_flow.effect_key"] == "default:A1:notify"
    assert named["reliable_flow.effect"]["reliable_flow.status"] == "succeeded"


_LATE_PROVIDER_CHILD = """
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from reliable_flow import Producer, tracing
from reliable_flow.reservation import RESERVATION

made = []
real = tracing._get_tracer
tracing._get_tracer = lambda: made.append(1) or real()
producer = Producer(sys.argv[1] + "/p.db", RESERVATION)
producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
before = len(made)
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
producer.advance("A2", "A", expected_seq=1, kind="released", payload={})
print(json.dumps([tracing.ACTIVE, before, len(made), [s.name for s in exporter.get_finished_spans()]]))
"""


def test_without_a_tracer_provider_no_span_is_made_and_a_later_one_is_followed(tmp_path: Path) -> None:
    assert _traced_child(tmp_path, _LATE_PROVIDER_CHILD) == [True, 0, 1, ["reliable_flow.advance"]]


@pytest.fixture(autouse=True)
def _no_leftover_levels() -> Iterator[None]:
    yield
    logging.getLogger("reliable_flow").setLevel(logging.NOTSET)
