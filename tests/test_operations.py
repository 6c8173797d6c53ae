"""Operating a stuck system, end to end on real files: why a flow is stuck
(``Consumer.stuck``, ``reliable-flow inspect [--flow | --event]`` and its exit
code), the recorded ways out of a bad accepted event (``skip_event``,
``replace_event``), the comparison of both sides (``reliable-flow compare``),
consumers as a registry (``Producer.consumers`` / ``register_consumer`` /
``remove_consumer``, ``relay(register=...)``, ``Worker(register=...)``,
``run --register``), the upgrade of older files, and the runbooks of
docs/operations.md.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from reliable_flow import (
    BlockReason,
    Consumer,
    DeliveryPolicy,
    FlowWait,
    InboxState,
    InvalidEnvelope,
    NotResolvable,
    Producer,
    Protocol,
    UnknownConsumer,
    UnknownEvent,
    Worker,
    relay,
    relay_batch,
)
from reliable_flow.protocol import exact, integer
from reliable_flow.reservation import RESERVATION
from reliable_flow.store.sqlite.connection import Database
from reliable_flow.store.sqlite.schema import CONSUMER, PRODUCER, FileKind
from reliable_flow.tools.drilldown import event_report
from reliable_flow.tools.inspection import inspect_files
from support import Clock, commit, digest, relay_log, run_cli, sql_execute, sql_pragma, sql_rows

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


def digests(*paths: Path) -> dict[str, str]:
    """The database files' bytes, and that no write-ahead log holds a frame (a
    read-only reader of a WAL file may leave an empty -wal and a -shm behind)."""
    for path in paths:
        wal = path.with_name(path.name + "-wal")
        assert not wal.exists() or wal.stat().st_size == 0, f"{wal} holds writes"
    return {path.name: digest(path) for path in paths}


# -- 1. why is it stuck -----------------------------------------------------------------------


def test_stuck_names_each_wait_with_its_time_reason_and_stored_detail(tmp_path: Path) -> None:
    clock = Clock(5000.0)
    with Consumer(tmp_path / "c.db", RESERVATION, clock=clock) as c:
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
    with Consumer(tmp_path / "c.db", RESERVATION) as c:  # stored, not kept in memory
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


def _troubled(tmp_path: Path) -> tuple[Path, Path]:
    """A blocked with its detail (schema 2), B at a gap, C1 set aside, D fully applied."""
    p_path, c_path = tmp_path / "producer.db", tmp_path / "consumer.db"
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
        p.redeliver("B2", consumer="default", actor="ops", reason="kick it")
    return p_path, c_path


def test_inspect_exits_1_for_a_block_a_set_aside_event_or_a_flow_stuck_too_long(tmp_path: Path) -> None:
    p_path, c_path = _troubled(tmp_path)
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


def test_inspect_exits_0_when_everything_is_through_and_1_when_a_step_waits_too_long(tmp_path: Path) -> None:
    p_path, c_path = tmp_path / "p.db", tmp_path / "c.db"
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


def test_inspect_flow_shows_both_sides_and_the_block_with_its_detail(tmp_path: Path) -> None:
    p_path, c_path = _troubled(tmp_path)
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


def test_inspect_event_shows_body_deliveries_operator_actions_and_the_inbox_row(tmp_path: Path) -> None:
    p_path, c_path = _troubled(tmp_path)
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


def test_a_lease_held_by_a_dead_relay_shows_its_owner_and_expiry(tmp_path: Path) -> None:
    class DiesMidSend(Consumer):
        def accept(self, body: str) -> Any:
            raise KeyboardInterrupt  # the relay process is killed while sending

    p_path, c_path = tmp_path / "p.db", tmp_path / "c.db"
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


def test_inspect_refuses_a_file_that_needs_an_upgrade_without_writing(tmp_path: Path) -> None:
    p_path, c_path = tmp_path / "p.db", tmp_path / "c.db"
    Producer(p_path, RESERVATION).close()
    _make_v2_consumer(c_path)
    before = digests(c_path)
    done = run_cli("inspect", str(p_path), str(c_path), "--flow", "A")
    assert done.returncode == 2 and "upgrade" in done.stderr
    assert digests(c_path) == before and sql_pragma(c_path, "user_version") == 2


def test_the_documented_json_keys_are_the_real_ones(tmp_path: Path) -> None:
    p_path, c_path = _troubled(tmp_path)
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


def _buggy_files(tmp_path: Path, bad_seq: int) -> tuple[Path, Path]:
    """Flow A from a buggy producer: step ``bad_seq`` carries amount 9 instead of 3;
    everything relayed and applied up to the block."""
    p_path, c_path = tmp_path / "producer.db", tmp_path / "consumer.db"
    with Producer(p_path, BUGGY) as p, Consumer(c_path, RESERVATION) as c:
        for seq, kind in enumerate(("reserved", "confirmed", "released")[:bad_seq], start=1):
            amount = 9 if seq == bad_seq else 3
            assert p.advance(f"A{seq}", "A", expected_seq=seq - 1, kind=kind,
                             payload={"amount": amount}).status == "committed"
        relay_log(p, c)
        c.process_all()
        assert c.stuck("A").wait == "blocked"
    return p_path, c_path


def test_skip_event_moves_the_flow_past_it_without_an_effect_and_is_recorded(tmp_path: Path) -> None:
    _, c_path = _buggy_files(tmp_path, bad_seq=3)
    clock = Clock(7000.0)
    with Consumer(c_path, RESERVATION, clock=clock) as c:
        before = c.projection("A")
        assert before == {"state": "confirmed", "last_seq": 2, "held": 3}
        action = c.skip_event("A3", actor="alice", reason="release was sent twice by mistake (INC-12)")
        assert (action.at, action.event_id, action.flow_id, action.seq, action.action, action.previous_state) == (
            7000.0, "A3", "A", 3, "skip", "blocked")
        assert c.projection("A") == {"state": "confirmed", "last_seq": 3, "held": 3}
        assert [e.seq for e in c.effects("A")] == [1, 2]  # no effect for the skipped step
        assert [(e.event_id, e.state) for e in c.inbox("A")][-1] == ("A3", "skipped")
        assert c.operator_actions() == [action] and c.operator_actions("A3") == [action]
        assert c.open_flows() == [] and c.stuck("A").wait == "idle"
        # A later step applies after the skipped one.
        c.receive(envelope("A4", "A", 4, "released"))
        assert c.apply_next("A").status == "applied"
    assert sql_rows(c_path, "SELECT action, actor, reason FROM consumer_action") == [
        ("skip", "alice", "release was sent twice by mistake (INC-12)")]


def test_skip_and_replace_refuse_what_they_cannot_do_and_write_nothing(tmp_path: Path) -> None:
    _, c_path = _buggy_files(tmp_path, bad_seq=2)
    with Consumer(c_path, RESERVATION) as c:
        c.receive(envelope("B2", "B", 2, "confirmed"))  # waits behind a gap
    before = digests(c_path)
    with Consumer(c_path, RESERVATION) as c:
        with pytest.raises(UnknownEvent):
            c.skip_event("Z9", actor="a", reason="r")
        with pytest.raises(NotResolvable, match="applied"):
            c.skip_event("A1", actor="a", reason="r")
        with pytest.raises(NotResolvable, match="next step is seq 1"):
            c.skip_event("B2", actor="a", reason="r")
        with pytest.raises(ValueError, match="actor"):
            c.skip_event("A2", actor=" ", reason="r")
        with pytest.raises(ValueError, match="reason"):
            c.replace_event("A2", envelope("A2-fix", "A", 2, "confirmed"), actor="a", reason="")
        with pytest.raises(InvalidEnvelope, match="flow and seq"):
            c.replace_event("A2", envelope("A2-fix", "A", 3, "confirmed"), actor="a", reason="r")
        with pytest.raises(InvalidEnvelope, match="new event id"):
            c.replace_event("A2", envelope("A1", "A", 2, "confirmed"), actor="a", reason="r")
        with pytest.raises(InvalidEnvelope):
            c.replace_event("A2", {"event_id": "A2-fix"}, actor="a", reason="r")
        with pytest.raises(NotResolvable):
            c.replace_event("A1", envelope("A1-fix", "A", 1, "reserved"), actor="a", reason="r")
        assert c.operator_actions() == []
    assert digests(c_path) == before


def test_runbook_a_a_bad_accepted_event_is_replaced_by_a_corrected_one(tmp_path: Path) -> None:
    """docs/operations.md, runbook (a): a producer bug committed a bad event."""
    p_path, c_path = _buggy_files(tmp_path, bad_seq=2)
    # Reveal: inspect exits 1 and names the block with its detail.
    code, report = cli_json("inspect", str(p_path), str(c_path), "--event", "A2")
    assert code == 1
    assert report["consumer"]["row"]["detail"] == "payload.amount: must stay 3 as reserved, got 9"
    assert report["producer"]["event"]["payload"] == {"amount": 9}
    # Fix: the producer's team re-issues the step, correct, under a new id.
    corrected = envelope("A2-fix", "A", 2, "confirmed", amount=3)
    with Consumer(c_path, RESERVATION) as c:
        action = c.replace_event("A2", corrected, actor="bob", reason="producer bug #31: wrong amount")
        assert (action.action, action.replacement_event_id, action.previous_state) == ("replace", "A2-fix", "blocked")
        assert [(e.event_id, e.state) for e in c.inbox("A")] == [
            ("A1", "applied"), ("A2", "replaced"), ("A2-fix", "pending")]
        assert c.process_all()["A"].applied == 1
        assert c.projection("A") == {"state": "confirmed", "last_seq": 2, "held": 3}
        assert [e.event_id for e in c.effects("A")] == ["A1", "A2-fix"]
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


def test_compare_lists_a_difference_a_recorded_skip_explains_without_failing(tmp_path: Path) -> None:
    p_path, c_path = _buggy_files(tmp_path, bad_seq=3)
    before = digests(p_path, c_path)
    code, report = cli_json("compare", str(p_path), str(c_path))
    assert code == 1
    [diff] = report["consumers"][0]["differences"]
    assert (diff["flow_id"], diff["kind"], diff["explained_by"]) == ("A", "behind", [])
    assert digests(p_path, c_path) == before
    with Consumer(c_path, RESERVATION) as c:
        c.skip_event("A3", actor="alice", reason="the release is done by hand")
    code, report = cli_json("compare", str(p_path), str(c_path))
    assert code == 0 and report["differences"] == 0
    [diff] = report["consumers"][0]["differences"]
    assert (diff["kind"], diff["producer"]["state"], diff["consumer"]["state"]) == (
        "state_differs", "released", "confirmed")
    assert [(a["action"], a["actor"]) for a in diff["explained_by"]] == [("skip", "alice")]
    text = run_cli("compare", str(p_path), str(c_path)).stdout
    assert "explained: skip of A3 by alice" in text and "no unexplained differences" in text


def test_compare_finds_flows_missing_on_either_side_and_checks_every_consumer(tmp_path: Path) -> None:
    p_path = tmp_path / "p.db"
    with Producer(p_path, RESERVATION) as p, Consumer(tmp_path / "a.db", RESERVATION, name="a") as a, \
            Consumer(tmp_path / "b.db", RESERVATION, name="b") as b:
        commit(p, "A", 2)
        relay_log(p, a)
        a.process_all()
        p.register_consumer("b", actor="ops", reason="second consumer")
        b.receive(envelope("X1", "X", 1, "reserved"))  # a flow the producer never had
        b.process_all()
    code, report = cli_json("compare", str(p_path), str(tmp_path / "a.db"), str(tmp_path / "b.db"))
    assert code == 1
    by_name = {c["name"]: {d["flow_id"]: d["kind"] for d in c["differences"]} for c in report["consumers"]}
    assert by_name == {"a": {}, "b": {"A": "missing_on_consumer", "X": "missing_on_producer"}}
    assert report["differences"] == 2


# -- the restored backup runbook ---------------------------------------------------------------------


def _backup(source: Path, target: Path) -> None:
    with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(target)) as dst:
        src.backup(dst)


def test_runbook_b_a_producer_restored_from_a_backup_catches_up_from_the_consumer(tmp_path: Path) -> None:
    """docs/operations.md, runbook (b): the consumer has events the producer lost."""
    p_path, c_path, backup = tmp_path / "producer.db", tmp_path / "consumer.db", tmp_path / "backup.db"
    with Producer(p_path, RESERVATION) as p, Consumer(c_path, RESERVATION) as c:
        commit(p, "A", 1)
        relay_log(p, c)
        _backup(p_path, backup)  # last night's backup: A1 only
        p.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"amount": 3}, meta={"by": "web"})
        commit(p, "B", 1)
        relay_log(p, c)
        c.process_all()
    # The producer's disk dies; the backup is restored.
    for f in tmp_path.glob("producer.db*"):
        f.unlink()
    backup.rename(p_path)
    # Reveal, before any writer starts again.
    code, report = cli_json("compare", str(p_path), str(c_path))
    assert code == 1
    kinds = {d["flow_id"]: d["kind"] for d in report["consumers"][0]["differences"]}
    assert kinds == {"A": "ahead", "B": "missing_on_producer"}
    # Fix: re-commit, from the consumer's copies, every event the producer lost.
    with Producer(p_path, RESERVATION) as p, Consumer(c_path, RESERVATION) as c:
        for flow in c.flows():
            for entry in c.inbox(flow):
                if entry.state == InboxState.REPLACED or p.event(entry.event_id) is not None:
                    continue
                e = c.event(entry.event_id)
                assert e is not None
                result = p.advance(e["event_id"], e["flow_id"], expected_seq=e["seq"] - 1, kind=e["kind"],
                                   payload=e["payload"], schema=e["schema"], meta=e.get("meta"))
                assert result.status == "committed", result
        assert sorted(relay_log(p, c)) == ["A2 duplicate", "B1 duplicate"]
        assert p.event("A2") == c.event("A2")
    assert run_cli("compare", str(p_path), str(c_path)).returncode == 0
    assert run_cli("inspect", str(p_path), str(c_path)).returncode == 0


def test_runbook_b_when_writers_already_went_on_the_conflict_is_set_aside_and_skipped(tmp_path: Path) -> None:
    p_path, c_path, backup = tmp_path / "producer.db", tmp_path / "consumer.db", tmp_path / "backup.db"
    with Producer(p_path, RESERVATION) as p, Consumer(c_path, RESERVATION) as c:
        commit(p, "A", 1)
        relay_log(p, c)
        _backup(p_path, backup)
        p.advance("A2", "A", expected_seq=1, kind="confirmed", payload={"amount": 3})
        relay_log(p, c)
        c.process_all()
    for f in tmp_path.glob("producer.db*"):
        f.unlink()
    backup.rename(p_path)
    with Producer(p_path, RESERVATION) as p, Consumer(c_path, RESERVATION) as c:
        # The application wrote again before anyone looked: another event at seq 2.
        p.advance("A2-again", "A", expected_seq=1, kind="confirmed", payload={"amount": 3})
        assert relay_log(p, c) == ["A2-again sequence_conflict"]
    code, report = cli_json("inspect", str(p_path), str(c_path))
    assert code == 1 and [a["kind"] for a in report["attention"]] == ["set_aside"]
    code, report = cli_json("compare", str(p_path), str(c_path))
    assert code == 1 and report["consumers"][0]["differences"][0]["kind"] == "event_differs"
    # Both steps meant the same; the consumer keeps its own: never deliver the copy.
    with Producer(p_path, RESERVATION) as p:
        p.skip("A2-again", consumer="default", actor="carol", reason="restored backup; consumer has A2")
    assert run_cli("inspect", str(p_path), str(c_path)).returncode == 0
    code, report = cli_json("compare", str(p_path), str(c_path))
    assert code == 0
    assert report["consumers"][0]["differences"][0]["explained_by"][0]["actor"] == "carol"


def test_a_restored_producer_lost_a_registration_and_refuses_the_name_until_registered_again(
    tmp_path: Path,
) -> None:
    p_path, backup = tmp_path / "producer.db", tmp_path / "backup.db"
    with Producer(p_path, RESERVATION) as p, Consumer(tmp_path / "c.db", RESERVATION) as c:
        commit(p, "A", 1)
        relay_log(p, c)
        _backup(p_path, backup)
    with Producer(backup, RESERVATION) as p, Consumer(tmp_path / "audit.db", RESERVATION, name="audit") as audit:
        with pytest.raises(UnknownConsumer, match="'audit'"):
            relay(p, audit)
        p.register_consumer("audit", actor="ops", reason="lost with the restore")
        assert relay_log(p, audit) == ["A1 accepted"]


# -- 3. consumers as a registry ----------------------------------------------------------------------


def test_the_first_consumer_is_registered_implicitly_and_a_second_name_is_refused(tmp_path: Path) -> None:
    with Producer(tmp_path / "p.db", RESERVATION) as p, Consumer(tmp_path / "c.db", RESERVATION) as c, \
            Consumer(tmp_path / "typo.db", RESERVATION, name="defualt") as typo:
        commit(p, "A", 2)
        assert relay_log(p, c) == ["A1 accepted", "A2 accepted"]
        [entry] = p.consumers()
        assert (entry.name, entry.uid, entry.bound, entry.backlog, entry.set_aside) == (
            "default", c.uid, True, 0, 0)
        assert entry.registered_at is not None and entry.from_now is False
        [auto] = p.registry_actions()
        assert (auto.consumer, auto.action, auto.actor) == ("default", "register", "relay")
        with pytest.raises(UnknownConsumer, match="no consumer named 'defualt' \\(registered: 'default'\\)") as info:
            relay(p, typo)
        assert isinstance(info.value, LookupError)
        with pytest.raises(UnknownConsumer):
            relay_batch(p, typo)
        assert [c.name for c in p.consumers()] == ["default"]
        assert typo.flows() == [] and all(set(e.deliveries) == {"default"} for e in p.outbox())


def test_relay_register_true_registers_a_new_name_from_the_first_event_and_records_it(tmp_path: Path) -> None:
    with Producer(tmp_path / "p.db", RESERVATION) as p, Consumer(tmp_path / "c.db", RESERVATION) as c, \
            Consumer(tmp_path / "audit.db", RESERVATION, name="audit") as audit:
        commit(p, "A", 2)
        relay_log(p, c)
        assert [r.event_id for r in relay_batch(p, audit, register=True).results] == ["A1", "A2"]
        assert [(a.consumer, a.actor, a.reason) for a in p.registry_actions("audit")] == [
            ("audit", "relay", "relay(register=True)")]


def test_register_consumer_from_the_first_event_or_from_now(tmp_path: Path) -> None:
    with Producer(tmp_path / "p.db", RESERVATION) as p, \
            Consumer(tmp_path / "full.db", RESERVATION, name="full") as full, \
            Consumer(tmp_path / "late.db", RESERVATION, name="late") as late:
        commit(p, "A", 2)
        before = time.time()
        full_action = p.register_consumer("full", actor="alice", reason="new reporting service")
        late_action = p.register_consumer("late", from_now=True, actor="alice", reason="only new work")
        assert (late_action.consumer, late_action.action, late_action.actor) == ("late", "register", "alice")
        assert p.registry_actions() == [full_action, late_action]
        listed = {e.name: e for e in p.consumers()}
        assert (listed["full"].bound, listed["full"].backlog, listed["full"].from_now) == (False, 2, False)
        assert (listed["late"].bound, listed["late"].backlog, listed["late"].from_now) == (False, 0, True)
        assert listed["late"].registered_at is not None and listed["late"].registered_at >= before
        commit(p, "B", 1)
        assert relay_log(p, full) == ["A1 accepted", "A2 accepted", "B1 accepted"]
        assert relay_log(p, late) == ["B1 accepted"]
        assert {e.name: (e.bound, e.uid) for e in p.consumers()} == {
            "full": (True, full.uid), "late": (True, late.uid)}
        with pytest.raises(NotResolvable, match="already registered"):
            p.register_consumer("full", actor="alice", reason="again")
        with pytest.raises(ValueError, match="name"):
            p.register_consumer("", actor="alice", reason="empty")
        with pytest.raises(ValueError, match="reason"):
            p.register_consumer("other", actor="alice", reason=" ")
        assert len(p.registry_actions()) == 2


def test_remove_consumer_drops_its_deliveries_and_refuses_it_afterwards(tmp_path: Path) -> None:
    p_path = tmp_path / "p.db"
    with Producer(p_path, RESERVATION) as p, Consumer(tmp_path / "c.db", RESERVATION) as c, \
            Consumer(tmp_path / "typo.db", RESERVATION, name="defualt") as typo:
        commit(p, "A", 2)
        relay_log(p, c)
        relay(p, typo, register=True)  # the typo was registered by mistake
        assert {e.name: e.backlog for e in p.consumers()} == {"default": 0, "defualt": 1}
        action = p.remove_consumer("defualt", actor="dave", reason="typo in the worker config")
        assert (action.consumer, action.action, action.actor) == ("defualt", "remove", "dave")
        assert [e.name for e in p.consumers()] == ["default"]
        assert all(set(e.deliveries) == {"default"} for e in p.outbox())
        with pytest.raises(UnknownConsumer):
            relay(p, typo)  # the same object forgot the binding too
        with pytest.raises(UnknownConsumer):
            p.remove_consumer("defualt", actor="dave", reason="twice")
        commit(p, "B", 1)
        assert relay_log(p, c) == ["B1 accepted"]
    assert [r[0] for r in sql_rows(p_path, "SELECT action FROM registry_action ORDER BY id")] == [
        "register", "register", "remove"]
    assert sql_rows(p_path, "SELECT count(*) FROM delivery WHERE consumer = 'defualt'") == [(0,)]


def test_inspect_shows_a_registered_name_no_relay_reached(tmp_path: Path) -> None:
    p_path, c_path = tmp_path / "p.db", tmp_path / "c.db"
    with Producer(p_path, RESERVATION) as p, Consumer(c_path, RESERVATION) as c:
        commit(p, "A", 1)
        relay_log(p, c)
        c.process_all()
        p.register_consumer("biling", actor="erin", reason="new billing service")
    done = run_cli("inspect", str(p_path), str(c_path))
    assert done.returncode == 0, done.stdout  # an unbound registration is shown, not an alert
    assert "consumer 'biling' is registered but no relay has reached it yet (a typo?): backlog 1" in done.stdout
    assert "action=register  consumer=biling  actor=erin" in done.stdout
    code, report = cli_json("inspect", str(p_path), str(c_path))
    assert code == 0 and report["attention"] == []
    assert {r["name"]: r["bound"] for r in report["producer"]["registry"]} == {"default": True, "biling": False}


def test_a_worker_refuses_an_unregistered_second_consumer_unless_asked_to_register(tmp_path: Path) -> None:
    with Producer(tmp_path / "p.db", RESERVATION) as p, Consumer(tmp_path / "a.db", RESERVATION, name="a") as a, \
            Consumer(tmp_path / "b.db", RESERVATION, name="b") as b:
        commit(p, "A", 1)
        with pytest.raises(UnknownConsumer, match="'b'"):
            Worker(p, [a, b])
        assert p.consumers() == []  # refused before anything was written
        Worker(p, [a], idle_sleep=0).run(max_passes=1, handle_signals=False)
        with pytest.raises(UnknownConsumer, match="'b'"):
            Worker(p, [a, b])
        stats = Worker(p, [a, b], idle_sleep=0, register=True).run(max_passes=1, handle_signals=False)
        assert stats.relayed["accepted"] == 1 and stats.errors == 0
        assert [e.name for e in p.consumers()] == ["a", "b"]


def test_cli_run_refuses_a_typo_and_registers_with_register(tmp_path: Path) -> None:
    p_path = tmp_path / "p.db"
    with Producer(p_path, RESERVATION) as p, Consumer(tmp_path / "a.db", RESERVATION, name="a") as a:
        commit(p, "A", 1)
        relay_log(p, a)
    Consumer(tmp_path / "b.db", RESERVATION, name="billing").close()
    files = ["--producer", str(p_path), "--consumer", f"a={tmp_path / 'a.db'}",
             "--consumer", f"billing={tmp_path / 'b.db'}", "--once"]
    refused = run_cli("run", *files)
    assert refused.returncode == 2
    assert "no consumer named 'billing'" in refused.stderr and "--register" in refused.stderr
    assert "Traceback" not in refused.stderr
    done = run_cli("run", *files, "--register")
    assert done.returncode == 0, done.stderr
    with Producer(p_path, RESERVATION) as p:
        assert [(e.name, e.backlog) for e in p.consumers()] == [("a", 0), ("billing", 0)]


# -- upgrades of older files ---------------------------------------------------------------------------


def _make_v2_consumer(path: Path) -> None:
    """A consumer file as the release with schema v2 wrote it: A1 applied, A2
    blocked, B2 waiting at a gap."""
    kind = FileKind("consumer", CONSUMER.application_id, CONSUMER.migrations[:2])
    db = Database(path, kind, on_create=lambda conn: conn.executemany(
        "INSERT INTO meta(key, value) VALUES (?, ?)",
        [("protocol", "reservation"), ("name", "default"), ("uid", "u-old")]))
    body = json.dumps  # the bodies only need to be JSON for these checks
    with db.write() as conn:
        conn.executemany("INSERT INTO inbox(event_id, flow_id, seq, body, state, reason) VALUES (?, ?, ?, ?, ?, ?)", [
            ("A1", "A", 1, body(envelope("A1", "A", 1, "reserved")), "applied", None),
            ("A2", "A", 2, body(envelope("A2", "A", 2, "confirmed", amount=9)), "blocked", "invalid_payload"),
            ("B2", "B", 2, body(envelope("B2", "B", 2, "confirmed")), "pending", None)])
        conn.execute("INSERT INTO projection VALUES ('A', 'reserved', 1, '{\"amount\":3}', '{\"held\":3}')")
        conn.execute("INSERT INTO effect(event_id, flow_id, seq, kind) VALUES ('A1', 'A', 1, 'reserved')")
    db.close()
    assert sql_pragma(path, "user_version") == 2


def test_a_v2_consumer_file_upgrades_in_place_and_its_rows_can_be_skipped_or_replaced(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    _make_v2_consumer(path)
    with Consumer(path, RESERVATION, clock=lambda: 9000.0) as c:
        assert sql_pragma(path, "user_version") == CONSUMER.version
        assert sql_rows(path, "SELECT event_id, state, reason, detail, received_at, blocked_at FROM inbox "
                              "ORDER BY event_id") == [
            ("A1", "applied", None, None, None, None), ("A2", "blocked", "invalid_payload", None, None, None),
            ("B2", "pending", None, None, None, None)]
        stuck = c.stuck("A")
        assert (stuck.wait, stuck.reason, stuck.detail, stuck.since) == ("blocked", "invalid_payload", None, None)
        assert c.stuck("B").since is None  # arrived before arrival times were kept
        c.apply_next("A")  # examined again: now the detail is stored; blocked_at stays unknown
        assert c.stuck("A").detail == "payload.amount: must stay 3 as reserved, got 9"
        c.replace_event("A2", envelope("A2-fix", "A", 2, "confirmed"), actor="ops", reason="after the upgrade")
        assert c.apply_next("A").status == "applied"
        assert (c.name, c.uid) == ("default", "u-old")
    schema = sql_rows(path, "SELECT sql FROM sqlite_master WHERE name = 'inbox'")[0][0]
    assert "'skipped','replaced'" in schema and "received_at" in schema


def test_a_v3_consumer_migration_that_fails_leaves_the_v2_file_intact(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    _make_v2_consumer(path)
    sql_execute(path, "CREATE TABLE consumer_action(note TEXT)")  # left there by someone: the last statement fails
    before = sql_rows(path, "SELECT * FROM inbox ORDER BY event_id")
    with pytest.raises(Exception, match="already exists"):
        Consumer(path, RESERVATION)
    assert sql_pragma(path, "user_version") == 2
    assert sql_rows(path, "SELECT * FROM inbox ORDER BY event_id") == before
    sql_execute(path, "DROP TABLE consumer_action")
    with Consumer(path, RESERVATION) as c:
        assert [e.state for e in c.inbox("A")] == ["applied", "blocked"]


def test_a_v2_producer_file_upgrades_keeping_its_bound_consumers(tmp_path: Path) -> None:
    p_path, c_path = tmp_path / "p.db", tmp_path / "c.db"
    with Consumer(c_path, RESERVATION) as c:
        uid = c.uid
    kind = FileKind("producer", PRODUCER.application_id, PRODUCER.migrations[:2])
    db = Database(p_path, kind, on_create=lambda conn: conn.execute(
        "INSERT INTO meta(key, value) VALUES ('protocol', 'reservation')"))
    from reliable_flow.envelope import make
    bodies = [make(event_id=f"A{n}", flow_id="A", seq=n, kind=k, schema=1, payload={"amount": 3}).body
              for n, k in ((1, "reserved"), (2, "confirmed"))]
    with db.write() as conn:
        conn.execute("INSERT INTO flow VALUES ('A', 2, 'confirmed', '{\"amount\":3}')")
        conn.executemany("INSERT INTO outbox(event_id, flow_id, seq, body) VALUES (?, 'A', ?, ?)",
                         [("A1", 1, bodies[0]), ("A2", 2, bodies[1])])
        conn.execute("INSERT INTO consumer(name, uid) VALUES ('default', ?)", (uid,))
        conn.execute("INSERT INTO delivery(consumer, pos, state, last_status, attempts) VALUES "
                     "('default', 1, 'accepted', 'accepted', 1), ('default', 2, 'pending', NULL, 0)")
    db.close()
    with Producer(p_path, RESERVATION) as p, Consumer(c_path, RESERVATION) as c, \
            Consumer(tmp_path / "new.db", RESERVATION, name="new") as new:
        assert sql_pragma(p_path, "user_version") == PRODUCER.version
        [entry] = p.consumers()
        assert (entry.name, entry.uid, entry.bound, entry.registered_at, entry.backlog) == (
            "default", uid, True, None, 1)
        assert p.registry_actions() == []
        assert relay_log(p, c) == ["A2 accepted"]
        with pytest.raises(UnknownConsumer):
            relay(p, new)  # the upgraded file has a consumer: a new name is no longer implicit
    assert sql_rows(p_path, "SELECT name, uid FROM consumer") == [("default", uid)]


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
