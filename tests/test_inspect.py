"""`reliable-flow inspect`: what an operator sees, in text and JSON, without
writing; on both engines (the ``at`` fixture: a SQLite file or a PostgreSQL
schema per store)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from engine_reads import contents, is_pg, store_exists
from reliable_flow import Consumer, Producer, relay
from reliable_flow.reservation import RESERVATION
from support import run_cli, troubled_history

At = Callable[[str], str]  # the ``at`` fixture of conftest.py: a store location by label, on the test's engine


def _troubled_files(at: At) -> tuple[str, str]:
    """A is blocked (schema 2), B has a gap, C1 is set aside, D1 was never relayed."""
    p_path, c_path = at("producer"), at("consumer")
    troubled_history(p_path, c_path)
    return p_path, c_path


def test_text_report_names_every_problem(at: At) -> None:
    p_path, c_path = _troubled_files(at)
    before = (contents(p_path), contents(c_path))
    done = run_cli("inspect", str(p_path), str(c_path))
    assert done.returncode == 1, done.stderr  # blocked and set aside: needs attention
    out = done.stdout
    assert "producer (reservation): 4 flows, 7 events" in out
    assert "to consumer 'default': 4 accepted, 2 undelivered, 1 set aside" in out
    assert "event_id=C1  flow_id=C  seq=1  last_status=id_conflict  attempts=1" in out
    assert "action=redeliver  event_id=B2  consumer=default  actor=ops  reason=kick it" in out
    assert "inbox 1 pending, 1 blocked, 3 applied" in out
    assert "flow_id=A  seq=2  event_id=A2  reason=unsupported_schema" in out
    assert "flow_id=B  missing_seq=2  waiting=[3]" in out
    assert (contents(p_path), contents(c_path)) == before


def test_json_report_is_machine_readable(at: At) -> None:
    p_path, c_path = _troubled_files(at)
    done = run_cli("inspect", str(p_path), str(c_path), "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    default = report["producer"]["consumers"]["default"]
    assert [e["event_id"] for e in default["pending"]] == ["B2", "D1"]
    assert [e["event_id"] for e in default["set_aside"]] == ["C1"]
    blocked, gaps = report["consumer"]["blocked"], report["consumer"]["gaps"]
    assert blocked[0].pop("detail") == "schema 2 is not decoded by this consumer (decodes [1])"
    assert blocked[0].pop("blocked_at") > 0 and gaps[0].pop("since") > 0
    assert report["consumer"]["blocked"] == [
        {"flow_id": "A", "event_id": "A2", "seq": 2, "reason": "unsupported_schema", "meta": {}}
    ]
    assert report["consumer"]["gaps"] == [{"flow_id": "B", "missing_seq": 2, "waiting": [3], "meta": [{}]}]
    assert report["consumer"]["inbox"] == {"pending": 1, "blocked": 1, "applied": 3, "skipped": 0, "replaced": 0, "superseded": 0}


def test_wrong_or_missing_files_are_a_clear_error(at: At) -> None:
    p_path, c_path = _troubled_files(at)
    swapped = run_cli("inspect", str(c_path), str(p_path))
    assert swapped.returncode == 2
    thing = "store" if is_pg(p_path) else "file"
    assert f"is a reliable_flow consumer {thing}, not a producer {thing}" in swapped.stderr
    absent = at("absent")
    missing = run_cli("inspect", str(p_path), absent)
    assert missing.returncode == 2 and absent.rpartition("#")[2] in missing.stderr  # the file, or the schema
    assert not store_exists(absent)


class _Killed(BaseException):
    """Stands for the relay process dying while it sends (no except clause catches it)."""


class _DiesWhileSending(Consumer):
    def accept(self, body: str):  # type: ignore[no-untyped-def, override]
        raise _Killed


def test_a_lease_held_by_a_dead_relay_is_shown_with_its_holder_and_end(tmp_path: Path, at: At) -> None:
    from reliable_flow import DeliveryPolicy

    p_path, c_path = at("producer"), at("consumer")
    with Producer(p_path, RESERVATION) as producer, _DiesWhileSending(c_path, RESERVATION) as consumer:
        producer.advance("A1", "A", expected_seq=0, kind="reserved", payload={"amount": 3})
        policy = DeliveryPolicy(lease_seconds=600, owner="relay-host:4242:dead")
        with pytest.raises(_Killed):
            relay(producer, consumer, policy=policy)
    done = run_cli("inspect", str(p_path), str(c_path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr  # a held lease is not stuck (yet)
    line = next(row for row in done.stdout.splitlines() if "event_id=A1" in row)
    assert "lease=held by relay-host:4242:dead until " in line, done.stdout
    report = json.loads(run_cli("inspect", str(p_path), str(c_path), "--json", cwd=tmp_path).stdout)
    [pending] = report["producer"]["consumers"]["default"]["pending"]
    assert pending["lease_owner"] == "relay-host:4242:dead" and pending["due_at"] > 0
