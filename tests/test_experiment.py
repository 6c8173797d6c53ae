"""The experiment: deterministic, checked against the frozen results, and saying what the seed says."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

import reliable_flow
from reliable_flow._tools.experiment import (
    FROZEN_RESULTS,
    SCENARIOS,
    check,
    compare,
    dumps,
    run_experiment,
)
from reliable_flow.crash import CRASH_EXIT_CODE, CRASH_POINTS
from support import run_cli

TIMEOUT = 300  # seconds; a watchdog, the experiment itself takes a few


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli("experiment", *args, cwd=cwd, timeout=TIMEOUT)


def _ints(obj: Any) -> list[int]:
    if isinstance(obj, bool):
        return []
    if isinstance(obj, int):
        return [obj]
    if isinstance(obj, dict):
        return [i for v in obj.values() for i in _ints(v)]
    if isinstance(obj, list):
        return [i for v in obj for i in _ints(v)]
    return []


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    return run_experiment()


@pytest.fixture(scope="module")
def by_name(results: dict[str, Any]) -> dict[str, Any]:
    return {s["name"]: s["result"] for s in results["scenarios"]}


# -- determinism and the frozen file ------------------------------------------------------


def test_cli_run_is_byte_identical_to_an_in_process_run_and_passes_check(
    results: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "out.json"
    proc = _cli("--output", str(out), "--check", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert out.read_bytes() == dumps(results).encode("utf-8")
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and "all 28 scenarios match" in lines[0], proc.stdout


def test_frozen_file_is_exactly_what_the_tool_writes(results: dict[str, Any]) -> None:
    ok, diff = check(FROZEN_RESULTS, current=results)
    assert ok, diff
    assert diff == ""
    # Byte for byte, so the file was produced by --output and not typed or reformatted.
    assert FROZEN_RESULTS.read_text(encoding="utf-8") == dumps(results)


def test_check_against_an_altered_copy_fails_with_a_diff_naming_the_scenario(
    tmp_path: Path,
) -> None:
    frozen = json.loads(FROZEN_RESULTS.read_text(encoding="utf-8"))
    entry = next(s for s in frozen["scenarios"] if s["name"] == "naive_consumer")
    entry["result"]["naive"]["final"]["last_seq"] = 99
    altered = tmp_path / "altered.json"
    altered.write_text(dumps(frozen), encoding="utf-8")

    proc = _cli("--check", str(altered), cwd=tmp_path)

    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "=== scenario naive_consumer differs" in proc.stdout
    changed = [line for line in proc.stdout.splitlines() if line[:1] in "+-" and "last_seq" in line]
    assert [line[0] + line[1:].strip() for line in changed] == [
        '-"last_seq": 99,',
        '+"last_seq": 2,',
    ]
    assert proc.stdout.rstrip().endswith(
        "1 scenario(s) differ from the frozen results: naive_consumer"
    )


def test_check_of_a_missing_file_exits_2_without_running(tmp_path: Path) -> None:
    proc = _cli("--check", str(tmp_path / "absent.json"), cwd=tmp_path)
    assert proc.returncode == 2
    assert "cannot read" in proc.stderr


def test_compare_names_added_removed_and_changed_scenarios(results: dict[str, Any]) -> None:
    frozen = json.loads(dumps(results))
    current = json.loads(dumps(results))
    removed = frozen["scenarios"].pop(0)  # the frozen file lacks it: "new"
    current["scenarios"].pop()  # this run lacks the last one: "not produced"
    current["scenarios"][2]["result"] = {"changed": True}
    ok, diff = compare(frozen, current)
    assert not ok
    assert f"=== scenario {removed['name']} is new" in diff
    assert f"=== scenario {results['scenarios'][-1]['name']} is in the frozen results" in diff
    assert f"=== scenario {results['scenarios'][2]['name']} differs" in diff
    assert compare(results, json.loads(dumps(results))) == (True, "")


def test_results_hold_no_paths_pids_or_timings(results: dict[str, Any]) -> None:
    text = dumps(results)
    assert "/tmp" not in text
    assert tempfile.gettempdir() not in text
    assert "reliable_flow_experiment_" not in text
    assert ".db" not in text
    # Every number is a seq, a count, an amount or an exit code; a PID or a
    # timing in milliseconds would be larger.
    assert max(_ints(results)) < 1000
    assert str(os.getpid()) not in text or os.getpid() < 1000


# -- the table ------------------------------------------------------------------------------


def test_scenario_table() -> None:
    names = [s.name for s in SCENARIOS]
    assert len(names) == len(set(names)) == 28
    seed = [s.name for s in SCENARIOS if s.origin == "seed"]
    assert len(seed) >= 22
    assert [n for n in names if n.startswith("crash_at:")] == [
        f"crash_at:{p}" for p in CRASH_POINTS
    ]
    assert {s.origin for s in SCENARIOS} == {"seed", "ours"}


def test_wrong_ways_are_private() -> None:
    from reliable_flow._tools.experiment import wrong_ways

    assert "NEVER COPY" in (wrong_ways.__doc__ or "")
    for name in wrong_ways.__all__:
        assert name not in reliable_flow.__all__
        assert not hasattr(reliable_flow, name)


# -- what the scenarios say -----------------------------------------------------------------


def test_unsafe_dual_write_leaves_a_flow_with_no_event(by_name: dict[str, Any]) -> None:
    r = by_name["unsafe_dual_write"]
    assert r["child_exit_code"] == 81
    assert r["flow_A"] == {"state": "reserved", "seq": 1, "amount": 3}
    assert r["outbox"] == []
    assert r["relay"] == "idle"
    assert r["safe_advance_of_A1_afterwards"] == "stale"


def test_advance_idempotency(by_name: dict[str, Any]) -> None:
    attempts = by_name["advance_idempotency"]["attempts"]
    assert attempts["A1_again_identical"] == {"status": "existing", "seq": 1}
    for name in ("A1_changed_amount", "A1_changed_flow", "A1_changed_schema"):
        assert attempts[name]["status"] == "conflict"
    assert attempts["A4_new_id_stale_expected_seq"]["status"] == "stale"
    assert len(by_name["advance_idempotency"]["outbox_after"]) == 3


def test_accepted_is_not_applied(by_name: dict[str, Any]) -> None:
    r = by_name["accepted_is_not_applied"]
    assert [e["accepted"] for e in r["outbox"]] == [True, True, True]
    assert [row["state"] for row in r["inbox"]] == ["pending"] * 3
    assert r["projection"] is None
    assert r["effects"] == []


def test_arrival_3_1_2_table(by_name: dict[str, Any]) -> None:
    r = by_name["arrival_3_1_2"]
    assert r["child_exit_code"] == 0
    table = [(s["delivered"], s["by"], s["drain"], s["applied_prefix"]) for s in r["stages"]]
    assert table == [
        ("A3", "parent", {"applied": 0, "stop": "gap"}, []),
        ("A1", "child process", {"applied": 1, "stop": "gap"}, [1]),
        ("A2", "parent", {"applied": 2, "stop": "idle"}, [1, 2, 3]),
    ]
    assert r["projection"] == {"state": "released", "last_seq": 3, "held": 0}
    assert r["effect_kinds"] == ["reserved", "confirmed", "released"]


def test_naive_consumer_gets_the_wrong_answer_and_ours_does_not(by_name: dict[str, Any]) -> None:
    r = by_name["naive_consumer"]
    assert r["arrivals"] == ["A3", "A1", "A2", "A3"]
    assert r["naive"]["final"] == {"state": "confirmed", "last_seq": 2, "held": 3}
    assert r["naive"]["answers"][-1] == "ignored_duplicate"
    assert r["reliable_flow"]["final"] == {"state": "released", "last_seq": 3, "held": 0}


def test_schema_upgrade(by_name: dict[str, Any]) -> None:
    r = by_name["schema_upgrade"]
    assert r["schema_1_consumer"]["drain"] == {
        "applied": 1,
        "stop": "blocked",
        "reason": "unsupported_schema",
        "at_seq": 2,
    }
    assert r["schema_1_consumer"]["projection"]["last_seq"] == 1
    assert [row["state"] for row in r["schema_1_consumer"]["inbox"]] == [
        "applied",
        "blocked",
        "pending",
    ]
    assert r["schemas_1_2_consumer_same_file"]["drain"] == {"applied": 2, "stop": "idle"}
    assert r["schemas_1_2_consumer_same_file"]["projection"]["state"] == "released"
    assert r["inbox_bodies_equal_outbox_bodies"] is True


def test_flow_isolation(by_name: dict[str, Any]) -> None:
    r = by_name["flow_isolation"]
    assert r["projection_A"] == {"state": "reserved", "last_seq": 1, "held": 3}
    assert r["projection_B"] == {"state": "released", "last_seq": 3, "held": 0}


def test_poison_is_set_aside_and_does_not_starve_other_flows(by_name: dict[str, Any]) -> None:
    r = by_name["poison_isolation_and_explicit_relay"]
    assert [(x["event_id"], x["status"]) for x in r["plain_relays"]] == [
        ("A1", "id_conflict"),
        ("B1", "accepted"),
        (None, "idle"),
    ]
    assert r["A1_in_outbox"] == {
        "accepted": False,
        "state": "set_aside",
        "last_status": "id_conflict",
    }
    assert r["explicit_relays"] == {"B1": "duplicate", "A1": "id_conflict"}
    fixed = by_name["poison_resolved_then_explicit_relay"]
    assert fixed["explicit_relay_A1"] == "accepted"
    assert fixed["A1_in_outbox"]["accepted"] is True


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_every_crash_point_exits_73_and_recovers_to_one_effect(
    by_name: dict[str, Any], point: str
) -> None:
    r = by_name[f"crash_at:{point}"]
    assert r["child_exit_code"] == CRASH_EXIT_CODE == 73
    assert r["effect_count_after_recovery"] == 1
    assert r["after_recovery"]["projection"] == {"state": "reserved", "last_seq": 1, "held": 3}
    after = r["right_after_exit"]
    committed = point != "advance.after_flow_write" and point != "advance.after_outbox_insert"
    assert (after["flow"] is not None) == committed
    assert (len(after["outbox"]) == 1) == committed
    assert (after["projection"] is not None) == (point == "apply.after_commit")


def test_triggers_reject_without_half_commits(by_name: dict[str, Any]) -> None:
    outbox = by_name["trigger_rejected_outbox_insert"]
    assert outbox["advance_A2_raised"] == "sqlite3.IntegrityError"
    assert outbox["flow_unchanged"] is True
    effect = by_name["trigger_rejected_effect_insert"]
    assert effect["apply_next_raised"] == "sqlite3.IntegrityError"
    assert effect["right_after"]["projection"] is None
    assert [row["state"] for row in effect["right_after"]["inbox"]] == ["pending"]


def test_six_process_races(by_name: dict[str, Any]) -> None:
    assert by_name["race_same_event_advanced"]["statuses"] == {"committed": 1, "existing": 5}
    assert by_name["race_new_ids_expected_seq_0"]["statuses"] == {"committed": 1, "stale": 5}
    assert by_name["race_receive_one_envelope"]["statuses"] == {"accepted": 1, "duplicate": 5}
    assert by_name["race_apply_next_one_event"]["statuses"] == {"applied": 1, "idle": 5}
    assert len(by_name["race_apply_next_one_event"]["effects_A"]) == 1
    relays = by_name["race_relay_several_events"]
    assert relays["statuses_within_accepted_duplicate_idle"] is True
    assert relays["accepted_total"] == 6
    assert set(relays["outbox_accepted"].values()) == {True}
    for name in (
        "race_same_event_advanced",
        "race_new_ids_expected_seq_0",
        "race_receive_one_envelope",
        "race_apply_next_one_event",
        "race_relay_several_events",
    ):
        assert by_name[name]["all_racers_exited_0"] is True
