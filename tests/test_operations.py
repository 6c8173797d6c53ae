"""Operating a stuck system, end to end on real files: why a flow is stuck
(``Consumer.stuck``, ``reliable-flow inspect [--flow | --event]`` and its exit
code), the recorded ways out of a bad accepted event (``skip_event``,
``replace_event``), the comparison of both sides (``reliable-flow compare``),
consumers as a registry (``producer.admin.consumers`` / ``register_consumer`` /
``remove_consumer``, ``relay(register=...)``, ``Worker(register=...)``,
``run --register``), and the runbooks of docs/operations.md; on both engines
(a SQLite file or a PostgreSQL schema per store).  The restored-backup runbook
and the upgrade of older files are SQLite's: ``tests/sqlite/test_operations_sqlite.py``.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine_reads import contents, rows
from reliable_flow import (
    BlockReason,
    Consumer,
    DeliveryPolicy,
    Producer,
    Protocol,
    Worker,
    relay,
    relay_batch,
)
from reliable_flow._tools.drilldown import event_report
from reliable_flow._tools.inspection import inspect_files
from reliable_flow.errors import InvalidEnvelope, NotResolvable, UnknownConsumer, UnknownEvent
from reliable_flow.protocol import exact, integer
from reliable_flow.reservation import RESERVATION
from reliable_flow.statuses import FlowWait
from support import Clock, commit, relay_log, run_cli

DOCS = Path(__file__).resolve().parents[1] / "docs" / "operations.md"


def _carried_amount(state: str, kind: str, value: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    # The bug: every later step publishes whatever amount it was given, while
    # the producer's own data keeps the reserved one.
    return {"amount": data.get("amount", value["amount"])}


#: A producer with a bug: its protocol (named like the real one) lets a step
#: carry another amount than the reservation's, which consumers refuse.
BUGGY = Protocol(
    name="reservation", initial="new",
    transitions={"new": ["reserved"], "reserved": ["confirmed"], "confirmed": ["released"]},
    schemas={1: exact({"amount": integer(1, 1_000_000)})}, step=_carried_amount,
)


def envelope(event_id: str, flow_id: str, seq: int, kind: str, amount: int = 3) -> dict[str, Any]:
    return {"event_id": event_id, "flow_id": flow_id, "seq": seq, "kind": kind, "schema": 1,
            "payload": {"amount": amount}}


def cli_json(*args: str) -> tuple[int, dict[str, Any]]:
    done = run_cli(*args, "--json")
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


At = Callable[[str], str]  # the ``at`` fixture of conftest.py: a store location by label, on the test's engine


def digests(*locations: str) -> dict[str, Any]:
    """What the stores hold (``engine_reads.contents``), to show a read wrote nothing."""
    return {location: contents(location) for location in locations}


# -- 1. why is it stuck -----------------------------------------------------------------------


def test_stuck_names_each_wait_with_its_time_reason_and_stored_detail(at: At) -> None:
    clock = Clock(5000.0)
    with Consumer(at("c"), RESERVATION, clock=clock) as c:
        assert c.stuck("A").wait == FlowWait.IDLE  # nothing at all
        c.receive(envelope("A1", "A", 1, "reserved"))
        clock.t = 5010.0
        c.receive({**envelope("A2", "A", 2, "confirmed"), "schema": 2, "payload": {"units": 3}})
        clock.t = 5020.0
        c.receive(envelope("B2", "B", 2, "confirmed"))
        clock.t = 5030.0
        c.receive(envelope("B3", "B", 3, "released"))
        ready = c.stuck("A")
        assert (ready.wait, ready.next_seq, ready.since, ready.state, ready.last_seq) == ("ready", 1, 5000.0, None, 0)
        clock.t = 5040.0
        c.process_all()
        clock.t = 5050.0
        c.process_all()  # the block is examined again: its time stays the first one
    with Consumer(at("c"), RESERVATION) as c:  # stored, not kept in memory
        blocked = c.stuck("A")
        assert (blocked.wait, blocked.state, blocked.last_seq, blocked.next_seq) == ("blocked", "reserved", 1, 2)
        assert blocked.reason == BlockReason.UNSUPPORTED_SCHEMA
        assert blocked.detail == "schema 2 is not decoded by this consumer (decodes [1])"
        assert blocked.since == 5040.0
        [row] = blocked.rows
        assert (row.event_id, row.state, row.received_at, row.blocked_at) == ("A2", "blocked", 5010.0, 5040.0)
        gap = c.stuck("B")
        assert (gap.wait, gap.next_seq, gap.since, gap.detail) == ("gap", 1, 5020.0, "seq 1 has not arrived")
        assert [r.event_id for r in gap.rows] == ["B2", "B3"]
        with pytest.raises(InvalidEnvelope):
            c.stuck("")


def _troubled(at: At) -> tuple[str, str]:
    """A blocked with its detail (schema 2), B at a gap, C1 set aside, D fully applied."""
    p_path, c_path = at("producer"), at("consumer")
    with Producer(p_path, RESERVATION) as p, Consumer(c_path, RESERVATION) as c:
        p.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3}, meta={"trace": "t-7"})
        p.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"units": 3}, schema=2)
        commit(p, "B")
        p.advance("C1", "C", expected_seq=0, kind="reserved", payload={"amount": 1})
        commit(p, "D")
        c.receive(envelope("C1", "C", 1, "reserved", amount=9))
        for event_id in ("A1", "A2", "B1", "B3", "C1", "D1", "D2", "D3"):
            relay(p, c, event_id=event_id)
        c.process_all()
        p.admin.redeliver("B2", consumer="default", actor="ops", reason="kick it")
    return p_path, c_path


def test_inspect_exits_1_for_a_block_a_set_aside_event_or_a_flow_stuck_too_long(at: At) -> None:
    p_path, c_path = _troubled(at)
    before = digests(p_path, c_path)
    code, report = cli_json("inspect", str(p_path), str(c_path))
    assert code == 1
    kinds = {(a["kind"], a["flow_id"]) for a in report["attention"]}
    assert kinds == {("blocked", "A"), ("set_aside", "C")}  # B's gap is young: not stuck yet
    [blocked] = [a for a in report["attention"] if a["kind"] == "blocked"]
    assert blocked["detail"] == "schema 2 is not decoded by this consumer (decodes [1])"
    assert (blocked["event_id"], blocked["seq"], blocked["reason"], blocked["consumer"]) == (
        "A2", 2, "unsupported_schema", "default")
    code, report = cli_json("inspect", str(p_path), str(c_path), "--stuck-after", "0")
    assert code == 1 and ("gap", "B") in {(a["kind"], a["flow_id"]) for a in report["attention"]}
    assert report["stuck_after"] == 0
    assert report["consumer"]["gaps"][0]["since"] > 0
    assert digests(p_path, c_path) == before  # read only


def test_inspect_exits_0_when_everything_is_through_and_1_when_a_step_waits_too_long(at: At) -> None:
    p_path, c_path = at("p"), at("c")
    with Producer(p_path, RESERVATION) as p, Consumer(c_path, RESERVATION) as c:
        commit(p, "A")
        relay_log(p, c)
        c.process_all()
    done = run_cli("inspect", str(p_path), str(c_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "nothing needs attention (stuck after 300 s)" in done.stdout
    # A next step delivered 1000 s ago that no apply took: stuck.
    with Producer(p_path, RESERVATION) as p, \
            Consumer(c_path, RESERVATION, clock=lambda: time.time() - 1000) as c:
        commit(p, "B", 1)
        relay_log(p, c)
    code, report = cli_json("inspect", str(p_path), str(c_path))
    assert code == 1
    [item] = report["attention"]
    assert (item["kind"], item["flow_id"], item["seq"], item["event_id"]) == ("ready", "B", 1, "B1")
    assert "apply" in item["detail"]
    assert cli_json("inspect", str(p_path), str(c_path), "--stuck-after", "5000")[0] == 0


def test_inspect_flow_shows_both_sides_and_the_block_with_its_detail(at: At) -> None:
    p_path, c_path = _troubled(at)
    before = digests(p_path, c_path)
    code, report = cli_json("inspect", str(p_path), str(c_path), "--flow", "A")
    assert code == 1
    assert report["producer"]["flow"] == {"state": "confirmed", "seq": 2, "amount": 3}
    assert [(e["event_id"], e["deliveries"]["default"]["state"]) for e in report["producer"]["events"]] == [
        ("A1", "accepted"), ("A2", "accepted")]
    flow = report["consumer"]["flow"]
    assert (flow["wait"], flow["next_seq"], flow["state"], flow["reason"]) == (
        "blocked", 2, "reserved", "unsupported_schema")
    assert flow["rows"][0]["detail"] == "schema 2 is not decoded by this consumer (decodes [1])"
    text = run_cli("inspect", str(p_path), str(c_path), "--flow", "A")
    assert text.returncode == 1
    assert "next seq 2: blocked since" in text.stdout
    assert "unsupported_schema: schema 2 is not decoded" in text.stdout
    healthy = run_cli("inspect", str(p_path), str(c_path), "--flow", "D")
    assert healthy.returncode == 0, healthy.stdout
    assert "next seq 4: idle" in healthy.stdout
    gap = cli_json("inspect", str(p_path), str(c_path), "--flow", "B", "--stuck-after", "0")
    assert gap[0] == 1 and gap[1]["consumer"]["flow"]["wait"] == "gap"
    assert digests(p_path, c_path) == before


def test_inspect_event_shows_body_deliveries_operator_actions_and_the_inbox_row(at: At) -> None:
    p_path, c_path = _troubled(at)
    code, report = cli_json("inspect", str(p_path), str(c_path), "--event", "A1")
    assert code == 0  # applied: nothing about this event needs attention
    assert report["producer"]["event"]["meta"] == {"trace": "t-7"}
    assert report["producer"]["event"]["schema"] == 1
    assert report["producer"]["deliveries"]["default"]["state"] == "accepted"
    assert report["consumer"]["row"]["state"] == "applied"
    code, report = cli_json("inspect", str(p_path), str(c_path), "--event", "B2")
    assert code == 0
    assert [(a["action"], a["actor"], a["reason"]) for a in report["producer"]["operator_actions"]] == [
        ("redeliver", "ops", "kick it")]
    assert report["consumer"]["row"] is None and report["consumer"]["event"] is None
    code, report = cli_json("inspect", str(p_path), str(c_path), "--event", "C1")
    assert code == 1
    assert report["attention"][0]["kind"] == "set_aside" and report["attention"][0]["reason"] == "id_conflict"
    assert report["producer"]["event"]["payload"] == {"amount": 1}
    assert report["consumer"]["event"]["payload"] == {"amount": 9}  # what the consumer holds under the id
    text = run_cli("inspect", str(p_path), str(c_path), "--event", "C1").stdout
    assert "another body under this id" in text and "last answer id_conflict" in text


def test_a_lease_held_by_a_dead_relay_shows_its_owner_and_expiry(at: At) -> None:
    class DiesMidSend(Consumer):
        def accept(self, body: str) -> Any:
            raise KeyboardInterrupt  # the relay process is killed while sending

    p_path, c_path = at("p"), at("c")
    clock = Clock(1000.0)
    with Producer(p_path, RESERVATION) as p:
        commit(p, "A", 1)
        with DiesMidSend(c_path, RESERVATION) as dying, pytest.raises(KeyboardInterrupt):
            relay(p, dying, policy=DeliveryPolicy(lease_seconds=60, clock=clock, owner="host-1:4242"))
    held = event_report(p_path, c_path, "A1", now=1030.0)["producer"]["deliveries"]["default"]
    assert (held["state"], held["lease_owner"], held["due_at"], held["lease_expired"]) == (
        "pending", "host-1:4242", 1060.0, False)
    assert event_report(p_path, c_path, "A1", now=1061.0)["producer"]["deliveries"]["default"]["lease_expired"]
    text = run_cli("inspect", str(p_path), str(c_path), "--event", "A1").stdout
    assert "lease expired by host-1:4242" in text  # the real clock is far past 1060
    # Once it expired, another relay takes the event over.
    clock.t = 1061.0
    with Producer(p_path, RESERVATION) as p, Consumer(c_path, RESERVATION) as c:
        assert relay(p, c, policy=DeliveryPolicy(lease_seconds=60, clock=clock, owner="host-2")).status == "accepted"
    after = event_report(p_path, c_path, "A1")["producer"]["deliveries"]["default"]
    assert (after["state"], after["lease_owner"]) == ("accepted", None)


def test_the_documented_json_keys_are_the_real_ones(at: At) -> None:
    p_path, c_path = _troubled(at)
    doc = DOCS.read_text(encoding="utf-8")
    summary = inspect_files(p_path, c_path, stuck_after=0)
    flow = cli_json("inspect", str(p_path), str(c_path), "--flow", "A")[1]
    event = cli_json("inspect", str(p_path), str(c_path), "--event", "A2")[1]
    compared = cli_json("compare", str(p_path), str(c_path))[1]
    keys = (set(summary) | set(summary["consumer"]) | set(summary["producer"]) | set(summary["attention"][0])
            | set(summary["consumer"]["waiting"][0]) | set(summary["consumer"]["blocked"][0])
            | set(summary["producer"]["registry"][0]) | set(flow) | set(flow["producer"]) | set(flow["consumer"])
            | set(flow["consumer"]["flow"]) | set(flow["consumer"]["flow"]["rows"][0])
            | set(flow["producer"]["events"][0]["deliveries"]["default"]) | set(event) | set(event["producer"])
            | set(event["consumer"]) | set(compared) | set(compared["consumers"][0])
            | set(compared["consumers"][0]["differences"][0]))
    missing = sorted(k for k in keys if f"`{k}`" not in doc)
    assert missing == []


# -- 2. a way out for a bad accepted event ----------------------------------------------------------


def _buggy_files(at: At, bad_seq: int) -> tuple[str, str]:
    """Flow A from a buggy producer: step ``bad_seq`` carries amount 9 instead of 3;
    everything relayed and applied up to the block."""
    p_path, c_path = at("producer"), at("consumer")
    with Producer(p_path, BUGGY) as p, Consumer(c_path, RESERVATION) as c:
        for seq, kind in enumerate(("reserved", "confirmed", "released")[:bad_seq], start=1):
            amount = 9 if seq == bad_seq else 3
            assert p.advance(f"A{seq}", "A", expected_seq=seq - 1, kind=kind,
                             payload={"amount": amount}).status == "committed"
        relay_log(p, c)
        c.process_all()
        assert c.stuck("A").wait == "blocked"
    return p_path, c_path


def test_skip_event_moves_the_flow_past_it_without_an_effect_and_is_recorded(at: At) -> None:
    _, c_path = _buggy_files(at, bad_seq=3)
    clock = Clock(7000.0)
    with Consumer(c_path, RESERVATION, clock=clock) as c:
        before = c.projection("A")
        assert before == {"state": "confirmed", "last_seq": 2, "held": 3}
        action = c.admin.skip_event("A3", actor="alice", reason="release was sent twice by mistake (INC-12)")
        assert (action.at, action.event_id, action.flow_id, action.seq, action.action, action.previous_state) == (
            7000.0, "A3", "A", 3, "skip", "blocked")
        assert c.projection("A") == {"state": "confirmed", "last_seq": 3, "held": 3}
        assert [e.seq for e in c.applied("A")] == [1, 2]  # no effect for the skipped step
        assert [(e.event_id, e.state) for e in c.inbox("A")][-1] == ("A3", "skipped")
        assert c.admin.operator_actions() == [action] and c.admin.operator_actions("A3") == [action]
        assert c.open_flows() == [] and c.stuck("A").wait == "idle"
        # A later step applies after the skipped one.
        c.receive(envelope("A4", "A", 4, "released"))
        assert c.apply_next("A").status == "applied"
    assert rows(c_path, "SELECT action, actor, reason FROM consumer_action") == [
        ("skip", "alice", "release was sent twice by mistake (INC-12)")]


def test_skip_and_replace_refuse_what_they_cannot_do_and_write_nothing(at: At) -> None:
    _, c_path = _buggy_files(at, bad_seq=2)
    with Consumer(c_path, RESERVATION) as c:
        c.receive(envelope("B2", "B", 2, "confirmed"))  # waits behind a gap
    before = digests(c_path)
    with Consumer(c_path, RESERVATION) as c:
        with pytest.raises(UnknownEvent):
            c.admin.skip_event("Z9", actor="a", reason="r")
        with pytest.raises(NotResolvable, match="applied"):
            c.admin.skip_event("A1", actor="a", reason="r")
        with pytest.raises(NotResolvable, match="next step is seq 1"):
            c.admin.skip_event("B2", actor="a", reason="r")
        with pytest.raises(ValueError, match="actor"):
            c.admin.skip_event("A2", actor=" ", reason="r")
        with pytest.raises(ValueError, match="reason"):
            c.admin.replace_event("A2", envelope("A2-fix", "A", 2, "confirmed"), actor="a", reason="")
        with pytest.raises(InvalidEnvelope, match="flow and seq"):
            c.admin.replace_event("A2", envelope("A2-fix", "A", 3, "confirmed"), actor="a", reason="r")
        with pytest.raises(InvalidEnvelope, match="new event id"):
            c.admin.replace_event("A2", envelope("A1", "A", 2, "confirmed"), actor="a", reason="r")
        with pytest.raises(InvalidEnvelope):
            c.admin.replace_event("A2", {"event_id": "A2-fix"}, actor="a", reason="r")
        with pytest.raises(NotResolvable):
            c.admin.replace_event("A1", envelope("A1-fix", "A", 1, "reserved"), actor="a", reason="r")
        assert c.admin.operator_actions() == []
    assert digests(c_path) == before


def test_runbook_a_a_bad_accepted_event_is_replaced_by_a_corrected_one(at: At) -> None:
    """docs/operations.md, runbook (a): a producer bug committed a bad event."""
    p_path, c_path = _buggy_files(at, bad_seq=2)
    # Reveal: inspect exits 1 and names the block with its detail.
    code, report = cli_json("inspect", str(p_path), str(c_path), "--event", "A2")
    assert code == 1
    assert report["consumer"]["row"]["detail"] == "payload.amount: must stay 3 as reserved, got 9"
    assert report["producer"]["event"]["payload"] == {"amount": 9}
    # Fix: the producer's team re-issues the step, correct, under a new id.
    corrected = envelope("A2-fix", "A", 2, "confirmed", amount=3)
    with Consumer(c_path, RESERVATION) as c:
        action = c.admin.replace_event("A2", corrected, actor="bob", reason="producer bug #31: wrong amount")
        assert (action.action, action.replacement_event_id, action.previous_state) == ("replace", "A2-fix", "blocked")
        assert [(e.event_id, e.state) for e in c.inbox("A")] == [
            ("A1", "applied"), ("A2", "replaced"), ("A2-fix", "pending")]
        assert c.process_all()["A"].applied == 1
        assert c.projection("A") == {"state": "confirmed", "last_seq": 2, "held": 3}
        assert [e.event_id for e in c.applied("A")] == ["A1", "A2-fix"]
        assert c.event("A2") == {**envelope("A2", "A", 2, "confirmed", amount=9)}  # kept as it arrived
    # The producer (bug fixed) goes on; the old event relayed again is a duplicate.
    with Producer(p_path, RESERVATION) as p, Consumer(c_path, RESERVATION) as c:
        assert relay(p, c, event_id="A2").status == "duplicate"
        assert p.advance("A3", "A", expected_seq=2, kind="released", payload={"amount": 3}).status == "committed"
        assert relay_log(p, c) == ["A3 accepted"]
        assert c.process_all()["A"].applied == 1
    assert run_cli("inspect", str(p_path), str(c_path)).returncode == 0
    done = run_cli("compare", str(p_path), str(c_path))
    assert done.returncode == 0, done.stdout
    code, report = cli_json("inspect", str(p_path), str(c_path), "--event", "A2-fix")
    assert code == 0 and report["attention"] == []
    assert [a["action"] for a in report["consumer"]["actions"]] == ["replace"]


def test_compare_lists_a_difference_a_recorded_skip_explains_without_failing(at: At) -> None:
    p_path, c_path = _buggy_files(at, bad_seq=3)
    before = digests(p_path, c_path)
    code, report = cli_json("compare", str(p_path), str(c_path))
    assert code == 1
    [diff] = report["consumers"][0]["differences"]
    assert (diff["flow_id"], diff["kind"], diff["explained_by"]) == ("A", "behind", [])
    assert digests(p_path, c_path) == before
    with Consumer(c_path, RESERVATION) as c:
        c.admin.skip_event("A3", actor="alice", reason="the release is done by hand")
    code, report = cli_json("compare", str(p_path), str(c_path))
    assert code == 0 and report["differences"] == 0
    [diff] = report["consumers"][0]["differences"]
    assert (diff["kind"], diff["producer"]["state"], diff["consumer"]["state"]) == (
        "state_differs", "released", "confirmed")
    assert [(a["action"], a["actor"]) for a in diff["explained_by"]] == [("skip", "alice")]
    text = run_cli("compare", str(p_path), str(c_path)).stdout
    assert "explained: skip of A3 by alice" in text and "no unexplained differences" in text


def test_compare_finds_flows_missing_on_either_side_and_checks_every_consumer(at: At) -> None:
    p_path = at("p")
    with Producer(p_path, RESERVATION) as p, Consumer(at("a"), RESERVATION, name="a") as a, \
            Consumer(at("b"), RESERVATION, name="b") as b:
        commit(p, "A", 2)
        relay_log(p, a)
        a.process_all()
        p.admin.register_consumer("b", actor="ops", reason="second consumer")
        b.receive(envelope("X1", "X", 1, "reserved"))  # a flow the producer never had
        b.process_all()
    code, report = cli_json("compare", str(p_path), str(at("a")), str(at("b")))
    assert code == 1
    by_name = {c["name"]: {d["flow_id"]: d["kind"] for d in c["differences"]} for c in report["consumers"]}
    assert by_name == {"a": {}, "b": {"A": "missing_on_consumer", "X": "missing_on_producer"}}
    assert report["differences"] == 2


# -- 3. consumers as a registry ----------------------------------------------------------------------


def test_the_first_consumer_is_registered_implicitly_and_a_second_name_is_refused(at: At) -> None:
    with Producer(at("p"), RESERVATION) as p, Consumer(at("c"), RESERVATION) as c, \
            Consumer(at("typo"), RESERVATION, name="defualt") as typo:
        commit(p, "A", 2)
        assert relay_log(p, c) == ["A1 accepted", "A2 accepted"]
        [entry] = p.admin.consumers()
        assert (entry.name, entry.uid, entry.bound, entry.backlog, entry.set_aside) == (
            "default", c.uid, True, 0, 0)
        assert entry.registered_at is not None and entry.from_now is False
        [auto] = p.admin.registry_actions()
        assert (auto.consumer, auto.action, auto.actor) == ("default", "register", "relay")
        with pytest.raises(UnknownConsumer, match="no consumer named 'defualt' \\(registered: 'default'\\)") as info:
            relay(p, typo)
        assert isinstance(info.value, LookupError)
        with pytest.raises(UnknownConsumer):
            relay_batch(p, typo)
        assert [c.name for c in p.admin.consumers()] == ["default"]
        assert typo.flows() == [] and all(set(e.deliveries) == {"default"} for e in p.outbox())


def test_relay_register_true_registers_a_new_name_from_the_first_event_and_records_it(at: At) -> None:
    with Producer(at("p"), RESERVATION) as p, Consumer(at("c"), RESERVATION) as c, \
            Consumer(at("audit"), RESERVATION, name="audit") as audit:
        commit(p, "A", 2)
        relay_log(p, c)
        assert [r.event_id for r in relay_batch(p, audit, register=True).results] == ["A1", "A2"]
        assert [(a.consumer, a.actor, a.reason) for a in p.admin.registry_actions("audit")] == [
            ("audit", "relay", "relay(register=True)")]


def test_register_consumer_from_the_first_event_or_from_now(at: At) -> None:
    with Producer(at("p"), RESERVATION) as p, \
            Consumer(at("full"), RESERVATION, name="full") as full, \
            Consumer(at("late"), RESERVATION, name="late") as late:
        commit(p, "A", 2)
        before = time.time()
        full_action = p.admin.register_consumer("full", actor="alice", reason="new reporting service")
        late_action = p.admin.register_consumer("late", from_now=True, actor="alice", reason="only new work")
        assert (late_action.consumer, late_action.action, late_action.actor) == ("late", "register", "alice")
        assert p.admin.registry_actions() == [full_action, late_action]
        listed = {e.name: e for e in p.admin.consumers()}
        assert (listed["full"].bound, listed["full"].backlog, listed["full"].from_now) == (False, 2, False)
        assert (listed["late"].bound, listed["late"].backlog, listed["late"].from_now) == (False, 0, True)
        assert listed["late"].registered_at is not None and listed["late"].registered_at >= before
        commit(p, "B", 1)
        assert relay_log(p, full) == ["A1 accepted", "A2 accepted", "B1 accepted"]
        assert relay_log(p, late) == ["B1 accepted"]
        assert {e.name: (e.bound, e.uid) for e in p.admin.consumers()} == {
            "full": (True, full.uid), "late": (True, late.uid)}
        with pytest.raises(NotResolvable, match="already registered"):
            p.admin.register_consumer("full", actor="alice", reason="again")
        with pytest.raises(ValueError, match="name"):
            p.admin.register_consumer("", actor="alice", reason="empty")
        with pytest.raises(ValueError, match="reason"):
            p.admin.register_consumer("other", actor="alice", reason=" ")
        assert len(p.admin.registry_actions()) == 2


def test_remove_consumer_drops_its_deliveries_and_refuses_it_afterwards(at: At) -> None:
    p_path = at("p")
    with Producer(p_path, RESERVATION) as p, Consumer(at("c"), RESERVATION) as c, \
            Consumer(at("typo"), RESERVATION, name="defualt") as typo:
        commit(p, "A", 2)
        relay_log(p, c)
        relay(p, typo, register=True)  # the typo was registered by mistake
        assert {e.name: e.backlog for e in p.admin.consumers()} == {"default": 0, "defualt": 1}
        action = p.admin.remove_consumer("defualt", actor="dave", reason="typo in the worker config")
        assert (action.consumer, action.action, action.actor) == ("defualt", "remove", "dave")
        assert [e.name for e in p.admin.consumers()] == ["default"]
        assert all(set(e.deliveries) == {"default"} for e in p.outbox())
        with pytest.raises(UnknownConsumer):
            relay(p, typo)  # the same object forgot the binding too
        with pytest.raises(UnknownConsumer):
            p.admin.remove_consumer("defualt", actor="dave", reason="twice")
        commit(p, "B", 1)
        assert relay_log(p, c) == ["B1 accepted"]
    assert [r[0] for r in rows(p_path, "SELECT action FROM registry_action ORDER BY id")] == [
        "register", "register", "remove"]
    assert rows(p_path, "SELECT count(*) FROM delivery WHERE consumer = 'defualt'") == [(0,)]


def test_inspect_shows_a_registered_name_no_relay_reached(at: At) -> None:
    p_path, c_path = at("p"), at("c")
    with Producer(p_path, RESERVATION) as p, Consumer(c_path, RESERVATION) as c:
        commit(p, "A", 1)
        relay_log(p, c)
        c.process_all()
        p.admin.register_consumer("biling", actor="erin", reason="new billing service")
    done = run_cli("inspect", str(p_path), str(c_path))
    assert done.returncode == 0, done.stdout  # an unbound registration is shown, not an alert
    assert "consumer 'biling' is registered but no relay has reached it yet (a typo?): backlog 1" in done.stdout
    assert "action=register  consumer=biling  actor=erin" in done.stdout
    code, report = cli_json("inspect", str(p_path), str(c_path))
    assert code == 0 and report["attention"] == []
    assert {r["name"]: r["bound"] for r in report["producer"]["registry"]} == {"default": True, "biling": False}


def test_a_worker_refuses_an_unregistered_second_consumer_unless_asked_to_register(at: At) -> None:
    with Producer(at("p"), RESERVATION) as p, Consumer(at("a"), RESERVATION, name="a") as a, \
            Consumer(at("b"), RESERVATION, name="b") as b:
        commit(p, "A", 1)
        with pytest.raises(UnknownConsumer, match="'b'"):
            Worker(p, [a, b])
        assert p.admin.consumers() == []  # refused before anything was written
        Worker(p, [a], idle_sleep=0).run(max_passes=1, handle_signals=False)
        with pytest.raises(UnknownConsumer, match="'b'"):
            Worker(p, [a, b])
        stats = Worker(p, [a, b], idle_sleep=0, register=True).run(max_passes=1, handle_signals=False)
        assert stats.relayed["accepted"] == 1 and stats.errors == 0
        assert [e.name for e in p.admin.consumers()] == ["a", "b"]


def test_cli_run_refuses_a_typo_and_registers_with_register(at: At) -> None:
    p_path = at("p")
    with Producer(p_path, RESERVATION) as p, Consumer(at("a"), RESERVATION, name="a") as a:
        commit(p, "A", 1)
        relay_log(p, a)
    Consumer(at("b"), RESERVATION, name="billing").close()
    files = ["--producer", str(p_path), "--consumer", f"a={at('a')}",
             "--consumer", f"billing={at('b')}", "--once"]
    refused = run_cli("run", *files)
    assert refused.returncode == 2
    assert "no consumer named 'billing'" in refused.stderr and "--register" in refused.stderr
    assert "Traceback" not in refused.stderr
    done = run_cli("run", *files, "--register")
    assert done.returncode == 0, done.stderr
    with Producer(p_path, RESERVATION) as p:
        assert [(e.name, e.backlog) for e in p.admin.consumers()] == [("a", 0), ("billing", 0)]


# -- the operations page -------------------------------------------------------------------------------


def test_the_operations_page_walks_through_every_stuck_case_with_its_commands() -> None:
    doc = DOCS.read_text(encoding="utf-8")
    for heading in ("A flow is stuck at a gap", "A flow is blocked", "An event is set aside",
                    "A lease held by a dead relay", "A bad accepted event", "A producer restored from a backup",
                    "A typo'd consumer name"):
        assert re.search(rf"^#+ .*{re.escape(heading)}", doc, flags=re.MULTILINE), heading
    for command in ("inspect producer.db consumer.db --flow", "--event", "--stuck-after", "compare producer.db",
                    "skip_event(", "replace_event(", "register_consumer(", "remove_consumer(", "--register"):
        assert command in doc, command
