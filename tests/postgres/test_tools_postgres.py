"""The operator tools on PostgreSQL locations, and on a pair that mixes engines:
``reliable_flow.snapshot()``, ``reliable-flow inspect`` (summary, ``--flow``,
``--event``), ``compare`` and ``metrics``.

Each tool must give the same report as on two SQLite files holding the same
history, write nothing (the stores are opened read only: a read-only
session on PostgreSQL), and refuse a missing, swapped or malformed store
with exit 2 and a message naming it, creating nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine_reads import new_location
from pg_cluster import pg_location
from reliable_flow import Consumer, PostgresLocation, Producer, relay, snapshot
from reliable_flow.reservation import RESERVATION
from support import digest, run_cli, troubled_history

pytestmark = pytest.mark.postgres

#: (producer engine, consumer engine): both on PostgreSQL, and both mixes.
PAIRS = [("postgres", "postgres"), ("postgres", "sqlite"), ("sqlite", "postgres")]


@pytest.fixture(params=PAIRS, ids=lambda pair: "->".join(pair))
def pair(request: pytest.FixtureRequest, pg_cluster: Any, tmp_path: Path) -> tuple[str, str]:
    """A producer and a consumer location on the engines of the parameter, with the troubled history."""
    p_engine, c_engine = request.param
    p_loc, c_loc = new_location(p_engine, tmp_path, "producer"), new_location(c_engine, tmp_path, "consumer")
    troubled_history(p_loc, c_loc)
    return p_loc, c_loc


@pytest.fixture
def sqlite_pair(tmp_path: Path) -> tuple[str, str]:
    """The same history on two SQLite files: what every report is compared with."""
    p_loc, c_loc = str(tmp_path / "ref-producer.db"), str(tmp_path / "ref-consumer.db")
    troubled_history(p_loc, c_loc)
    return p_loc, c_loc


_VOLATILE = {"at", "due_at", "since", "blocked_at", "received_at", "checked_at", "updated_at", "committed_at",
             "registered_at", "uid"}  # and the random uid the relay binds a consumer name to


def _stable(value: Any) -> Any:
    """``value`` with the wall-clock times (which differ between two runs) left out."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in _VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _cli_json(*args: str) -> tuple[int, dict[str, Any]]:
    done = run_cli(*args, "--json")
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


# -- snapshot() --------------------------------------------------------------------------------


def test_snapshot_reads_postgres_and_mixed_pairs_as_it_reads_files(
    pair: tuple[str, str], sqlite_pair: tuple[str, str]
) -> None:
    got = snapshot(*pair)
    assert set(got["producer"]) == {"protocol", "flows", "outbox", "operator_actions"}
    assert set(got["consumer"]) == {"protocol", "name", "order", "projections", "inbox", "effects", "effect_outbox",
                                    "effect_actions", "schedules", "schedule_actions"}
    assert _stable(got) == _stable(snapshot(*sqlite_pair))
    assert snapshot(*pair) == got  # read only: a second look sees the same


def test_snapshot_takes_a_postgres_location_object_with_its_own_schema(pg_cluster: Any, tmp_path: Path) -> None:
    import psycopg

    p_loc, c_path = pg_location("producer"), str(tmp_path / "consumer.db")
    troubled_history(p_loc, c_path)
    url, _, schema = p_loc.partition("#")
    spelt = PostgresLocation(lambda: psycopg.connect(url), schema=schema)
    assert snapshot(spelt, c_path) == snapshot(p_loc, c_path)


def test_snapshot_of_a_missing_schema_creates_nothing(pg_cluster: Any, tmp_path: Path) -> None:
    from reliable_flow.errors import WrongFile

    p_loc, c_loc = pg_location("producer"), pg_location("consumer")
    troubled_history(p_loc, str(tmp_path / "consumer.db"))
    with pytest.raises(WrongFile, match="no consumer store at .*the schema does not exist"):
        snapshot(p_loc, c_loc)
    assert not _schema_exists(c_loc)


def _schema_exists(location: str) -> bool:
    import psycopg

    url, _, schema = location.partition("#")
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is not None


# -- inspect -----------------------------------------------------------------------------------


def test_inspect_reports_the_same_on_postgres_and_mixed_pairs(
    pair: tuple[str, str], sqlite_pair: tuple[str, str]
) -> None:
    before = snapshot(*pair)
    done = run_cli("inspect", *pair)
    assert done.returncode == 1, done.stderr  # blocked and set aside: needs attention
    out = done.stdout
    assert "producer (reservation): 4 flows, 7 events" in out
    assert "to consumer 'default': 4 accepted, 2 undelivered, 1 set aside" in out
    assert "event_id=C1  flow_id=C  seq=1  last_status=id_conflict  attempts=1" in out
    assert "action=redeliver  event_id=B2  consumer=default  actor=ops  reason=kick it" in out
    assert "inbox 1 pending, 1 blocked, 3 applied" in out
    assert "flow_id=A  seq=2  event_id=A2  reason=unsupported_schema" in out
    assert "flow_id=B  missing_seq=2  waiting=[3]" in out
    for focus in ([], ["--flow", "B"], ["--flow", "A"], ["--event", "C1"], ["--event", "A2"]):
        code, report = _cli_json("inspect", *pair, *focus)
        ref_code, reference = _cli_json("inspect", *sqlite_pair, *focus)
        assert (code, _stable(report)) == (ref_code, _stable(reference)), focus
    assert snapshot(*pair) == before  # nothing written


def test_inspect_event_shows_an_id_conflict_across_engines(pair: tuple[str, str]) -> None:
    code, report = _cli_json("inspect", *pair, "--event", "C1")
    assert code == 1
    assert report["producer"]["event"]["payload"] == {"amount": 1}
    assert report["consumer"]["event"]["payload"] == {"amount": 9}
    assert "another body under this id" in run_cli("inspect", *pair, "--event", "C1").stdout


def test_inspect_refuses_swapped_missing_or_malformed_postgres_locations(pg_cluster: Any, tmp_path: Path) -> None:
    p_loc, c_loc = pg_location("producer"), pg_location("consumer")
    troubled_history(p_loc, c_loc)
    swapped = run_cli("inspect", c_loc, p_loc)
    assert swapped.returncode == 2
    assert "is a reliable_flow consumer store, not a producer store" in swapped.stderr
    absent = pg_location("absent")
    missing = run_cli("inspect", p_loc, absent)
    assert missing.returncode == 2 and "the schema does not exist" in missing.stderr, missing.stderr
    assert not _schema_exists(absent)
    bad = run_cli("inspect", p_loc, c_loc.partition("#")[0] + "#pg_no")
    assert bad.returncode == 2 and "schema must be a PostgreSQL identifier" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


# -- compare -----------------------------------------------------------------------------------


def test_compare_on_postgres_and_mixed_pairs(pair: tuple[str, str], sqlite_pair: tuple[str, str]) -> None:
    before = snapshot(*pair)
    code, report = _cli_json("compare", *pair)
    ref_code, reference = _cli_json("compare", *sqlite_pair)
    assert code == ref_code == 1
    for r in (report, reference):
        r.pop("producer")
        for c in r["consumers"]:
            c.pop("path")
    assert report == reference
    assert {d["flow_id"]: d["kind"] for d in report["consumers"][0]["differences"]} == {
        "A": "behind", "B": "behind", "D": "missing_on_consumer"}
    assert snapshot(*pair) == before


def test_compare_agrees_after_everything_is_delivered_and_names_stores_without_password(
    pg_cluster: Any, tmp_path: Path
) -> None:
    p_loc, c_loc, c_path = pg_location("producer"), pg_location("consumer"), str(tmp_path / "consumer.db")
    with Producer(p_loc, RESERVATION) as p, Consumer(c_loc, RESERVATION, name="pg") as on_pg, \
            Consumer(c_path, RESERVATION, name="file") as on_file:
        p.admin.register_consumer("pg", actor="ops", reason="test")
        p.admin.register_consumer("file", actor="ops", reason="test")
        for i, kind in enumerate(["reserved", "confirmed"]):
            p.advance(f"A{i + 1}", "A", expected_seq=i, kind=kind, payload={"amount": 2})
        for consumer in (on_pg, on_file):
            while relay(p, consumer).status != "idle":
                pass
            consumer.process_all()
    # A password in the URL (the test server trusts the socket, so any works) is never printed.
    url, _, schema = p_loc.partition("#")
    secret = url.replace("postgresql:///", "postgresql://postgres:s3cret@/", 1) + "#" + schema
    done = run_cli("compare", secret, c_loc, c_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "s3cret" not in done.stdout
    assert "no unexplained differences" in done.stdout
    code, report = _cli_json("compare", secret, c_loc, c_path)
    assert code == 0 and report["differences"] == 0
    assert "s3cret" not in report["producer"] and report["producer"].endswith("#" + schema)
    assert "postgres:***@" in report["producer"]
    assert [(c["name"], c["path"]) for c in report["consumers"]] == [("pg", c_loc), ("file", c_path)]


def test_compare_refuses_a_swapped_postgres_store(pg_cluster: Any) -> None:
    p_loc, c_loc = pg_location("producer"), pg_location("consumer")
    troubled_history(p_loc, c_loc)
    done = run_cli("compare", c_loc, p_loc)
    assert done.returncode == 2 and "not a producer store" in done.stderr, done.stderr


# -- metrics -----------------------------------------------------------------------------------


def test_metrics_on_postgres_and_mixed_pairs(pair: tuple[str, str], sqlite_pair: tuple[str, str]) -> None:
    before = snapshot(*pair)
    ages = {"oldest_pending_age", "oldest_pending", "at"}

    def without_ages(report: dict[str, Any]) -> Any:
        def strip(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: strip(v) for k, v in value.items() if k not in ages}
            return value
        return strip(report)

    code, report = _cli_json("metrics", *pair)
    _, reference = _cli_json("metrics", *sqlite_pair)
    assert code == 0
    assert without_ages(report) == without_ages(reference)
    assert report["producer"]["events"] == 7 and report["consumer"]["consumer"] == "default"
    text = run_cli("metrics", *pair)
    assert text.returncode == 0 and "producer: 7 events, 4 flows" in text.stdout, text.stderr
    prometheus = run_cli("metrics", *pair, "--prometheus")
    assert prometheus.returncode == 0 and "# TYPE " in prometheus.stdout, prometheus.stderr
    assert snapshot(*pair) == before


def test_metrics_refuses_a_missing_postgres_store_and_leaves_sqlite_files_untouched(
    pg_cluster: Any, tmp_path: Path
) -> None:
    p_loc, c_path = pg_location("producer"), tmp_path / "consumer.db"
    troubled_history(p_loc, str(c_path))
    before = digest(c_path)
    absent = pg_location("absent")
    missing = run_cli("metrics", absent, str(c_path))
    assert missing.returncode == 2 and "no producer store at" in missing.stderr, missing.stderr
    assert not _schema_exists(absent)
    assert run_cli("metrics", p_loc, str(c_path)).returncode == 0
    assert digest(c_path) == before
