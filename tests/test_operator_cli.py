"""Operator actions from the command line (``_tools/operator_cli.py``): each
command calls one operator method of the Python API, records ``--actor``
and ``--reason``, and answers with the exit codes of ``inspect``: 0 done,
1 refused by the rules (nothing changed), 2 an error (nothing changed,
nothing created).

Behaviour on both engines (the ``engine`` fixture): the stores are SQLite
files or PostgreSQL schemas of the session's private server.  Commands run
in-process through ``cli.main``, and as a real ``python -m reliable_flow``
child process.
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pytest

from engine_reads import contents, is_pg, new_location, rows
from reliable_flow import (
    Consumer,
    DeliveryPolicy,
    Producer,
    relay,
)
from reliable_flow._tools.cli import main
from reliable_flow.reservation import RESERVATION
from support import (
    Clock,
    Unreachable,
    commit,
    dead_effects,
    outbox_entry,
    run_cli,
    troubled_history,
)

WHO = ["--actor", "alice", "--reason", "INC-7: checked by hand"]


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``reliable-flow ARGS`` in this process: exit code, stdout, stderr."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def exists(location: str) -> bool:
    """Whether a store exists at ``location``: a file, or a PostgreSQL schema."""
    if not is_pg(location):
        return os.path.exists(location)
    schema = location.partition("#")[2]
    return rows(location, "SELECT count(*) FROM pg_namespace WHERE nspname = ?", (schema,)) == [(1,)]


@pytest.fixture
def troubled(engine: str, tmp_path: Path) -> tuple[str, str]:
    """A producer and a consumer store with ``troubled_history``: A2 blocked
    in the inbox, a gap before B3, C1 set aside, D1 never relayed."""
    producer_at, consumer_at = new_location(engine, tmp_path, "producer"), new_location(engine, tmp_path, "consumer")
    troubled_history(producer_at, consumer_at)
    return producer_at, consumer_at


# -- deliveries ----------------------------------------------------------------------------------


def test_delivery_redeliver_and_skip_are_recorded_with_actor_and_reason(
    capsys: pytest.CaptureFixture[str], troubled: tuple[str, str]
) -> None:
    producer_at, _ = troubled
    code, out, err = cli(capsys, "delivery", "redeliver", producer_at, "default", "C1", *WHO)
    assert (code, err) == (0, "")
    assert out == ("delivery redeliver: event 'C1' is pending again for consumer 'default', due now "
                   "(was set_aside); recorded: actor 'alice', reason 'INC-7: checked by hand'\n")
    code, out, err = cli(capsys, "delivery", "skip", producer_at, "default", "D1", "--actor", "bob",
                         "--reason", "never wanted", "--json")
    assert (code, err) == (0, "")
    record = json.loads(out)
    assert {k: record[k] for k in ("action", "actor", "reason", "consumer", "event_id", "previous_state")} == {
        "action": "skip", "actor": "bob", "reason": "never wanted", "consumer": "default", "event_id": "D1",
        "previous_state": "pending"}
    with Producer(producer_at, RESERVATION) as producer:
        assert outbox_entry(producer, "C1").deliveries["default"].state == "pending"
        assert outbox_entry(producer, "D1").deliveries["default"].state == "skipped"
        mine = [(a.event_id, a.action, a.actor, a.reason) for a in producer.admin.operator_actions() if a.event_id != "B2"]
        assert mine == [("C1", "redeliver", "alice", "INC-7: checked by hand"),
                        ("D1", "skip", "bob", "never wanted")]


def test_delivery_refusals_are_exit_1_and_errors_exit_2_with_nothing_recorded(
    capsys: pytest.CaptureFixture[str], troubled: tuple[str, str]
) -> None:
    producer_at, consumer_at = troubled
    with Producer(producer_at, RESERVATION) as producer:
        before = producer.admin.operator_actions()
    code, out, err = cli(capsys, "delivery", "redeliver", producer_at, "default", "A1", *WHO)  # accepted
    assert (code, out) == (1, "")
    assert err.startswith("delivery redeliver: refused: event 'A1' is accepted for consumer 'default'")
    code, out, err = cli(capsys, "delivery", "skip", producer_at, "default", "nope", *WHO)
    assert (code, out) == (2, "")
    assert err.startswith("delivery skip: no delivery of event 'nope' to consumer 'default'")
    code, out, err = cli(capsys, "delivery", "skip", producer_at, "billing", "D1", *WHO)
    assert (code, out) == (2, "")
    assert err.startswith("delivery skip: no delivery of event 'D1' to consumer 'billing'")
    code, out, err = cli(capsys, "delivery", "skip", consumer_at, "default", "D1", *WHO)  # swapped
    assert (code, out) == (2, "")
    assert err.startswith("delivery skip: ") and "not a producer" in err
    with Producer(producer_at, RESERVATION) as producer:
        assert producer.admin.operator_actions() == before
        assert outbox_entry(producer, "D1").deliveries["default"].state == "pending"


def test_redeliver_releases_a_held_lease_at_once(
    capsys: pytest.CaptureFixture[str], engine: str, tmp_path: Path
) -> None:
    """Relay a claims A1 and dies inside the send, its lease running until
    1010; ``delivery redeliver`` hands A1 to relay b at 1005, at once."""
    producer_at, consumer_at = new_location(engine, tmp_path, "producer"), new_location(engine, tmp_path, "consumer")
    clock = Clock(1000.0)
    other = DeliveryPolicy(lease_seconds=10, clock=clock, owner="relay-b")
    with Producer(producer_at, RESERVATION) as producer, \
            Unreachable(consumer_at, RESERVATION, exc=lambda n: KeyboardInterrupt()) as dying, \
            Consumer(consumer_at, RESERVATION) as healthy:
        commit(producer, "A", 1)
        with pytest.raises(KeyboardInterrupt):
            relay(producer, dying, policy=DeliveryPolicy(lease_seconds=10, clock=clock, owner="relay-a"))
        clock.t = 1005.0
        assert relay(producer, healthy, policy=other).status == "idle"  # the lease holds A1 off
        code, out, _ = cli(capsys, "delivery", "redeliver", producer_at, "default", "A1", *WHO)
        assert code == 0 and "(was pending)" in out
        assert (relay(producer, healthy, policy=other).event_id, clock.t) == ("A1", 1005.0)
        assert outbox_entry(producer, "A1").deliveries["default"].state == "accepted"
        assert [row.event_id for row in healthy.inbox("A")] == ["A1"]


# -- the inbox -----------------------------------------------------------------------------------


def test_inbox_replace_and_skip_are_recorded_with_actor_and_reason(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, troubled: tuple[str, str]
) -> None:
    _, consumer_at = troubled
    fix = {"event_id": "A2-fix", "flow_id": "A", "seq": 2, "kind": "confirmed", "schema": 1, "payload": {"amount": 3}}
    (tmp_path / "fix.json").write_text(json.dumps(fix), encoding="utf-8")
    code, out, err = cli(capsys, "inbox", "replace", consumer_at, "A2", "--envelope", str(tmp_path / "fix.json"), *WHO)
    assert (code, err) == (0, "")
    assert out.startswith("inbox replace: event 'A2' replaced by 'A2-fix' (flow 'A' seq 2, was blocked), "
                          "stored pending; recorded: actor 'alice'")
    code, out, err = cli(capsys, "inbox", "skip", consumer_at, "B3", *WHO)  # behind a gap: not the next step
    assert (code, out) == (1, "")
    assert err.startswith("inbox skip: refused: event 'B3' is seq 3 of flow 'B'")
    fix2 = dict(fix, event_id="A2-fix2")
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(fix2)))
    code, out, err = cli(capsys, "inbox", "replace", consumer_at, "A2-fix", "--envelope", "-", *WHO, "--json")
    assert (code, err) == (0, "")
    assert json.loads(out)["replacement_event_id"] == "A2-fix2"
    code, out, err = cli(capsys, "inbox", "skip", consumer_at, "A2-fix2", "--actor", "bob", "--reason", "left out")
    assert (code, err) == (0, "")
    assert out.startswith("inbox skip: event 'A2-fix2' skipped (flow 'A' seq 2, was pending)")
    with Consumer(consumer_at, RESERVATION) as consumer:
        assert [(a.event_id, a.action, a.actor, a.reason, a.replacement_event_id)
                for a in consumer.admin.operator_actions()] == [
            ("A2", "replace", "alice", "INC-7: checked by hand", "A2-fix"),
            ("A2-fix", "replace", "alice", "INC-7: checked by hand", "A2-fix2"),
            ("A2-fix2", "skip", "bob", "left out", None)]
        assert [(r.event_id, r.state) for r in consumer.inbox("A")] == [
            ("A1", "applied"), ("A2", "replaced"), ("A2-fix", "replaced"), ("A2-fix2", "skipped")]


def test_a_bad_replacement_is_exit_2_naming_the_field_and_stores_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, troubled: tuple[str, str]
) -> None:
    _, consumer_at = troubled
    wrong_seq = {"event_id": "A3-fix", "flow_id": "A", "seq": 3, "kind": "released", "schema": 1,
                 "payload": {"amount": 3}}
    cases = {"seq.json": (json.dumps(wrong_seq), "a replacement must have the flow and seq"),
             "broken.json": ("{not json", "envelope"),
             "missing.json": (None, "cannot read --envelope")}
    for name, (text, message) in cases.items():
        if text is not None:
            (tmp_path / name).write_text(text, encoding="utf-8")
        code, out, err = cli(capsys, "inbox", "replace", consumer_at, "A2", "--envelope", str(tmp_path / name), *WHO)
        assert (code, out) == (2, ""), name
        assert err.startswith("inbox replace: ") and message in err, err
    code, _, err = cli(capsys, "inbox", "skip", consumer_at, "Z9", *WHO)
    assert code == 2 and err.startswith("inbox skip: ") and "'Z9'" in err
    with Consumer(consumer_at, RESERVATION) as consumer:
        assert consumer.admin.operator_actions() == []
        assert [(r.event_id, r.state) for r in consumer.inbox("A")] == [("A1", "applied"), ("A2", "blocked")]


# -- effects ------------------------------------------------------------------------------------


def test_effect_retry_resolve_cancel_are_recorded_with_actor_and_reason(
    capsys: pytest.CaptureFixture[str], engine: str, tmp_path: Path
) -> None:
    consumer_at = dead_effects(engine, tmp_path)
    a, b = "default:A1:notify", "default:B1:notify"
    code, out, err = cli(capsys, "effect", "retry", consumer_at, a, *WHO)
    assert (code, err) == (0, "")
    assert out == (f"effect retry: effect {a!r} is pending again, due now; "
                   f"recorded: actor 'alice', reason 'INC-7: checked by hand'\n")
    code, out, err = cli(capsys, "effect", "resolve", consumer_at, b, "--result", '{"parcel": "P-7"}', *WHO)
    assert (code, err) == (0, "")
    assert out.startswith(f'effect resolve: effect {b!r} is succeeded, result {{"parcel": "P-7"}}; ')
    code, out, err = cli(capsys, "effect", "cancel", consumer_at, a, "--actor", "bob", "--reason", "too late", "--json")
    assert (code, err) == (0, "")
    assert {k: v for k, v in json.loads(out).items() if k != "at"} == {
        "key": a, "action": "cancel", "actor": "bob", "reason": "too late"}
    with Consumer(consumer_at, RESERVATION) as consumer:
        assert [(e.action, e.actor, e.reason) for e in consumer.admin.effect_actions(a)] == [
            ("retry", "alice", "INC-7: checked by hand"), ("cancel", "bob", "too late")]
        assert [(e.action, e.actor) for e in consumer.admin.effect_actions(b)] == [("resolve", "alice")]
        assert (consumer.scheduled_effect(a).state, consumer.scheduled_effect(b).state) == ("cancelled", "succeeded")
        assert consumer.scheduled_effect(b).result == {"parcel": "P-7"}


def test_effect_refusals_are_exit_1_and_errors_exit_2_with_nothing_recorded(
    capsys: pytest.CaptureFixture[str], engine: str, tmp_path: Path
) -> None:
    consumer_at = dead_effects(engine, tmp_path)
    assert cli(capsys, "effect", "cancel", consumer_at, "default:A1:notify", *WHO)[0] == 0
    code, out, err = cli(capsys, "effect", "retry", consumer_at, "default:A1:notify", *WHO)
    assert (code, out) == (1, "")
    assert err.startswith("effect retry: refused: effect 'default:A1:notify' is cancelled; retry needs one of")
    code, out, err = cli(capsys, "effect", "retry", consumer_at, "no-such-key", *WHO)
    assert (code, out) == (2, "")
    assert err.startswith("effect retry: no effect with key 'no-such-key'")
    code, out, err = cli(capsys, "effect", "resolve", consumer_at, "default:B1:notify", "--result", "NaN", *WHO)
    assert (code, out) == (2, "")
    assert err.startswith("effect resolve: ") and "result" in err
    code, _, err = cli(capsys, "effect", "retry", consumer_at, "default:B1:notify", *WHO, "--protocol", "nosuch:X")
    assert code == 2 and err.startswith("effect retry: --protocol: cannot import 'nosuch'")
    with pytest.raises(SystemExit) as exited:
        main(["effect", "resolve", consumer_at, "default:B1:notify", "--result", "{not json", *WHO])
    assert exited.value.code == 2 and "argument --result: must be a JSON value" in capsys.readouterr().err
    with Consumer(consumer_at, RESERVATION) as consumer:
        assert [e.action for e in consumer.admin.effect_actions()] == ["cancel"]
        assert consumer.scheduled_effect("default:B1:notify").state == "dead"


# -- the registry -------------------------------------------------------------------------------


def test_registry_register_and_remove_are_recorded_with_actor_and_reason(
    capsys: pytest.CaptureFixture[str], troubled: tuple[str, str]
) -> None:
    producer_at, _ = troubled
    code, out, err = cli(capsys, "registry", "register", producer_at, "audit", "--from-now", *WHO)
    assert (code, err) == (0, "")
    assert out.startswith("registry register: consumer 'audit' registered: it gets events committed from now on;")
    code, out, err = cli(capsys, "registry", "register", producer_at, "audit", *WHO)
    assert (code, out) == (1, "")
    assert err.startswith("registry register: refused: ")
    code, out, err = cli(capsys, "registry", "remove", producer_at, "audit", "--actor", "bob", "--reason", "retired")
    assert (code, err) == (0, "")
    code, out, err = cli(capsys, "registry", "remove", producer_at, "audit", *WHO)
    assert (code, out) == (2, "")
    assert err.startswith("registry remove: ")
    with Producer(producer_at, RESERVATION) as producer:
        assert [(a.consumer, a.action, a.actor, a.reason) for a in producer.admin.registry_actions("audit")] == [
            ("audit", "register", "alice", "INC-7: checked by hand"), ("audit", "remove", "bob", "retired")]
        assert [c.name for c in producer.admin.consumers()] == ["default"]


# -- retention -------------------------------------------------------------------------------------


def test_retention_prune_counts_with_a_dry_run_then_prunes_recorded_on_either_kind(
    capsys: pytest.CaptureFixture[str], troubled: tuple[str, str]
) -> None:
    producer_at, consumer_at = troubled
    before = (contents(producer_at), contents(consumer_at))
    code, out, err = cli(capsys, "retention", "prune", producer_at, "--older-than", "0", "--dry-run")
    found = re.fullmatch(r"retention prune: dry run: the prune would remove (\d+) events; nothing changed\n", out)
    assert (code, err) == (0, "") and found is not None and int(found.group(1)) >= 1
    code, out, _ = cli(capsys, "retention", "prune", consumer_at, "--older-than", "0", "--dry-run", "--json")
    counted = json.loads(out)
    assert code == 0 and counted["kind"] == "consumer" and counted["events"] >= 1
    code, out, err = cli(capsys, "retention", "prune", producer_at, "--older-than", "0")  # who and why: required
    assert (code, out) == (2, "") and "--actor and --reason are required" in err
    for bad in (["--older-than", "nan"], ["--older-than", "0", "--limit", "0"],
                ["--older-than", "10", "--forget-after", "1"]):
        code, out, err = cli(capsys, "retention", "prune", producer_at, *bad, *WHO)
        assert (code, out) == (2, "") and err.startswith("retention prune: "), bad
    assert (contents(producer_at), contents(consumer_at)) == before  # nothing written, nothing recorded
    code, out, err = cli(capsys, "retention", "prune", producer_at, "--older-than", "0", *WHO)
    assert (code, err) == (0, "") and out.startswith(f"retention prune: pruned {found.group(1)} events, ")
    code, out, err = cli(capsys, "retention", "prune", consumer_at, "--older-than", "0", "--json", *WHO)
    assert (code, err) == (0, "")
    assert json.loads(out) == {**json.loads(out), "action": "prune", "actor": "alice",
                               "reason": "INC-7: checked by hand", "forget_before": None}
    with Producer(producer_at, RESERVATION) as producer, Consumer(consumer_at, RESERVATION) as consumer:
        assert [(a.action, a.actor) for a in producer.admin.retention_actions()] == [("prune", "alice")]
        assert [(a.action, a.actor) for a in consumer.admin.retention_actions()] == [("prune", "alice")]


# -- arguments and missing stores --------------------------------------------------------------

COMMANDS = [
    ("effect", "retry", "consumer", ["k"]), ("effect", "resolve", "consumer", ["k"]),
    ("effect", "cancel", "consumer", ["k"]), ("delivery", "redeliver", "producer", ["default", "A1"]),
    ("delivery", "skip", "producer", ["default", "A1"]), ("inbox", "skip", "consumer", ["A1"]),
    ("inbox", "replace", "consumer", ["A1", "--envelope", "-"]), ("registry", "register", "producer", ["audit"]),
    ("registry", "remove", "producer", ["audit"]),
]


def test_a_missing_store_is_exit_2_and_is_never_created(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, engine: str, tmp_path: Path
) -> None:
    for group, action, kind, rest in COMMANDS:
        location = new_location(engine, tmp_path, f"missing_{group}_{action}")
        monkeypatch.setattr("sys.stdin", io.StringIO("{}"))
        code, out, err = cli(capsys, group, action, location, *rest, *WHO)
        assert (code, out) == (2, ""), (group, action)
        assert err.startswith(f"{group} {action}: no {kind} "), err
        assert not exists(location), (group, action)


def test_the_read_only_commands_never_create_a_missing_store(
    capsys: pytest.CaptureFixture[str], engine: str, tmp_path: Path, troubled: tuple[str, str]
) -> None:
    producer_at, consumer_at = troubled
    for command in ("inspect", "compare", "metrics"):
        for which in ("producer", "consumer"):
            absent = new_location(engine, tmp_path, f"absent_{command}_{which}")
            pair = (absent, consumer_at) if which == "producer" else (producer_at, absent)
            code, out, err = cli(capsys, command, *pair)
            assert (code, out) == (2, ""), (command, which)
            assert err.startswith(f"{command}: no {which} "), err
            assert not exists(absent), (command, which)


def test_actor_and_reason_are_required_and_never_blank(
    capsys: pytest.CaptureFixture[str], troubled: tuple[str, str]
) -> None:
    producer_at, consumer_at = troubled
    for group, action, kind, rest in COMMANDS:
        store = producer_at if kind == "producer" else consumer_at
        for who, message in (
            (["--reason", "r"], "the following arguments are required: --actor"),
            (["--actor", "a"], "the following arguments are required: --reason"),
            (["--actor", "  ", "--reason", "r"], "argument --actor: actor must be a non-empty string"),
            (["--actor", "a", "--reason", ""], "argument --reason: reason must be a non-empty string"),
        ):
            with pytest.raises(SystemExit) as exited:
                main([group, action, store, *rest, *who])
            assert exited.value.code == 2
            assert message in capsys.readouterr().err
    with Producer(producer_at, RESERVATION) as producer, Consumer(consumer_at, RESERVATION) as consumer:
        assert [a.event_id for a in producer.admin.operator_actions()] == ["B2"]  # troubled_history's own
        assert consumer.admin.operator_actions() == [] and consumer.admin.effect_actions() == []
        assert [c.name for c in producer.admin.consumers()] == ["default"]


def test_the_commands_run_as_a_real_process(troubled: tuple[str, str], tmp_path: Path) -> None:
    producer_at, consumer_at = troubled
    done = run_cli("delivery", "skip", producer_at, "default", "D1", *WHO, "--json", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout)["previous_state"] == "pending"
    done = run_cli("inbox", "skip", consumer_at, "A2", *WHO, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("inbox skip: event 'A2' skipped (flow 'A' seq 2, was blocked)")
    done = run_cli("inbox", "skip", consumer_at, "A2", *WHO, cwd=tmp_path)  # skipped now: refused
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith("inbox skip: refused: ")
    done = run_cli("effect", "cancel", consumer_at, "k", "--reason", "r", cwd=tmp_path)
    assert done.returncode == 2 and "the following arguments are required: --actor" in done.stderr
    with Producer(producer_at, RESERVATION) as producer, Consumer(consumer_at, RESERVATION) as consumer:
        assert producer.admin.operator_actions("D1")[0].actor == "alice"
        assert [(a.event_id, a.action, a.actor) for a in consumer.admin.operator_actions()] == [("A2", "skip", "alice")]
