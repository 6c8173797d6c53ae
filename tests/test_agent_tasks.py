"""examples/agent_tasks.py: a second protocol, defined in user code, run end to end.

The second half holds contract tests parametrised over every protocol we ship
or document (RESERVATION and AGENT_TASK), so a rule that holds for one holds
for all.  Every store test runs on both engines (the ``at`` fixture); the
example's own main() writes SQLite files in a directory.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from reliable_flow import Consumer, Producer, relay
from reliable_flow.protocol import Protocol, exact, integer, text
from reliable_flow.records import AppliedEvent, InboxEntry
from reliable_flow.reservation import RESERVATION
from support import envelope, relay_until_idle

At = Callable[[str], str]  # the ``at`` fixture of conftest.py: a store location by label, on the test's engine

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "agent_tasks.py"


def _load_example() -> Any:
    spec = importlib.util.spec_from_file_location("agent_tasks_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no __pycache__ in examples/
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = saved
    return module


agent_tasks = _load_example()
AGENT_TASK: Protocol = agent_tasks.AGENT_TASK

Steps = list[tuple[str, dict[str, Any]]]

HAPPY: Steps = [
    ("requested", {"prompt": "Add 2 and 2, then look the answer up."}),
    ("planned", {"steps": 2}),
    ("tool_called", {"tool": "calculator", "call": 1}),
    ("tool_called", {"tool": "search", "call": 2}),
    ("answered", {"answer": "4"}),
]
KINDS = ["requested", "planned", "tool_called", "answered", "failed"]


@contextmanager
def opened(
    at: At, protocol: Protocol = AGENT_TASK, **consumer_kw: Any
) -> Iterator[tuple[Producer, Consumer]]:
    with (
        Producer(at("producer"), protocol) as producer,
        Consumer(at("consumer"), protocol, **consumer_kw) as consumer,
    ):
        yield producer, consumer


def advance_all(
    producer: Producer, steps: Steps, flow_id: str = "T", schema: int = 1, start: int = 0
) -> None:
    """Commit ``steps`` as events ``<flow_id>-<seq>``, the first one at seq ``start + 1``."""
    for seq, (kind, payload) in enumerate(steps, start=start + 1):
        r = producer.advance(
            f"{flow_id}-{seq}",
            flow_id,
            expected_seq=seq - 1,
            kind=kind,
            payload=payload,
            schema=schema,
        )
        assert (r.status, r.seq) == ("committed", seq), r.reason


# -- the happy path -----------------------------------------------------------------


def test_happy_path_committed_accepted_applied_with_projection_and_effects(at: At) -> None:
    expected_views = [(0, False), (0, False), (1, False), (2, False), (2, True)]
    with opened(at) as (producer, consumer):
        advance_all(producer, HAPPY)
        assert producer.flow("T") == {
            "state": "answered",
            "seq": 5,
            "steps": 2,
            "tool_calls": 2,
            "last_tool": "search",
        }
        for seq, ((kind, _), (calls, answered)) in enumerate(zip(HAPPY, expected_views), start=1):
            assert relay(producer, consumer).status == "accepted"
            r = consumer.apply_next("T")
            assert (r.status, r.seq, r.event_id) == ("applied", seq, f"T-{seq}")
            assert consumer.projection("T") == {
                "state": kind,
                "last_seq": seq,
                "tool_calls": calls,
                "answered": answered,
            }
        assert relay(producer, consumer).status == "idle"
        assert consumer.apply_next("T").status == "idle"
        assert consumer.applied("T") == [
            AppliedEvent(event_id=f"T-{seq}", flow_id="T", seq=seq, kind=kind)
            for seq, (kind, _) in enumerate(HAPPY, start=1)
        ]
        assert [e.accepted for e in producer.outbox("T")] == [True] * 5
        assert {row.state for row in consumer.inbox("T")} == {"applied"}


@pytest.mark.parametrize(
    "done", [1, 2, 3, 4], ids=["requested", "planned", "tool_called", "tool_called_twice"]
)
def test_failed_is_reachable_from_every_working_state_and_final(at: At, done: int) -> None:
    with opened(at) as (producer, consumer):
        advance_all(producer, HAPPY[:done])
        r = producer.advance(
            "T-f", "T", expected_seq=done, kind="failed", payload={"error": "tool timed out"}
        )
        assert r.status == "committed"
        for kind in KINDS:
            after = producer.advance(
                "T-late", "T", expected_seq=done + 1, kind=kind, payload={"error": "x"}
            )
            assert after.status == "invalid_transition", kind
        relay_until_idle(producer, consumer)
        assert consumer.drain("T").applied == done + 1
        projection = consumer.projection("T")
        assert projection is not None and projection["state"] == "failed"
        assert projection["answered"] is False


# -- every producer status the protocol can cause -----------------------------------


@pytest.mark.parametrize(
    "done, kind, payload",
    [
        (0, "planned", {"steps": 2}),
        (0, "answered", {"answer": "too soon"}),
        (1, "answered", {"answer": "before planned"}),
        (1, "tool_called", {"tool": "search", "call": 1}),
        (2, "requested", {"prompt": "again"}),
        (2, "answered", {"answer": "no tool call yet"}),
        (3, "planned", {"steps": 3}),
        *[(5, kind, {"answer": "after answered"}) for kind in KINDS],
    ],
)
def test_illegal_step_is_invalid_transition_and_writes_nothing(
    at: At, done: int, kind: str, payload: dict[str, Any]
) -> None:
    with opened(at) as (producer, _):
        advance_all(producer, HAPPY[:done])
        before = (producer.flow("T"), producer.outbox("T"))
        r = producer.advance("T-bad", "T", expected_seq=done, kind=kind, payload=payload)
        assert (r.status, r.seq) == ("invalid_transition", None)
        assert r.reason is not None and repr(kind) in r.reason
        assert (producer.flow("T"), producer.outbox("T")) == before


@pytest.mark.parametrize(
    "done, kind, payload, schema, problem",
    [
        (0, "requested", {}, 1, "payload.prompt: is required"),
        (0, "requested", {"prompt": "hi", "user": "bob"}, 1, "payload.user: is not allowed"),
        (0, "requested", {"prompt": ""}, 1, "payload.prompt"),
        (0, "requested", {"prompt": "x" * 2001}, 1, "payload.prompt"),
        (0, "requested", {"prompt": 42}, 1, "payload.prompt: must be a string"),
        (1, "planned", {"steps": 0}, 1, "payload.steps"),
        (1, "planned", {"steps": 21}, 1, "payload.steps"),
        (1, "planned", {"steps": True}, 1, "payload.steps: must be an int"),
        (1, "planned", {"steps": 2.0}, 1, "payload.steps: must be an int"),
        (2, "tool_called", {"tool": "shell", "call": 1}, 1, "payload.tool: must be one of"),
        (2, "tool_called", {"tool": "search", "call": 2}, 1, "payload.call: must be 1"),
        (3, "tool_called", {"tool": "search", "call": 1}, 1, "payload.call: must be 2"),
        (3, "tool_called", {"tool": "search", "call": 3}, 1, "payload.call: must be 2"),
        (
            4,
            "tool_called",
            {"tool": "search", "call": 3},
            1,
            "payload.call: exceeds the 2 planned steps",
        ),
        (
            2,
            "tool_called",
            {"tool_name": "search", "call": 1},
            1,
            "payload.tool_name: is not allowed",
        ),
        (2, "tool_called", {"tool": "search", "call": 1}, 2, "payload.tool: is not allowed"),
        (2, "tool_called", {"tool": "search", "call": 1}, 3, "schema 3 is not defined"),
        (4, "answered", {"answer": ""}, 1, "payload.answer"),
        (
            4,
            "answered",
            {"answer": "4", "confidence": 0.9},
            1,
            "payload.confidence: is not allowed",
        ),
        (1, "failed", {}, 1, "payload.error: is required"),
    ],
)
def test_rule_breaking_payload_is_invalid_payload_and_writes_nothing(
    at: At, done: int, kind: str, payload: dict[str, Any], schema: int, problem: str
) -> None:
    with opened(at) as (producer, _):
        advance_all(producer, HAPPY[:done])
        before = (producer.flow("T"), producer.outbox("T"))
        r = producer.advance(
            "T-bad", "T", expected_seq=done, kind=kind, payload=payload, schema=schema
        )
        assert (r.status, r.seq) == ("invalid_payload", None)
        assert r.reason is not None and problem in r.reason
        assert (producer.flow("T"), producer.outbox("T")) == before
        # Rejections are not stored: the same event id is free for the correct step.
        if done < len(HAPPY):
            good_kind, good_payload = HAPPY[done]
            ok = producer.advance(
                "T-bad", "T", expected_seq=done, kind=good_kind, payload=good_payload
            )
            assert ok.status == "committed"


def test_stale_existing_and_conflict(at: At) -> None:
    with opened(at) as (producer, _):
        advance_all(producer, HAPPY[:3])
        for expected in (0, 2, 4):
            r = producer.advance(
                "T-new",
                "T",
                expected_seq=expected,
                kind="tool_called",
                payload={"tool": "search", "call": 2},
            )
            assert (r.status, r.seq) == ("stale", None), expected
        kind, payload = HAPPY[0]
        r = producer.advance("T-1", "T", expected_seq=0, kind=kind, payload=payload)
        assert (r.status, r.seq) == ("existing", 1)  # even though the flow moved on
        changes: list[dict[str, Any]] = [
            {"payload": {"prompt": "another prompt"}},
            {"kind": "failed", "payload": {"error": "x"}},
            {"expected_seq": 3},
            {"schema": 2},
            {"flow_id": "U"},
        ]
        for change in changes:
            args: dict[str, Any] = {
                "flow_id": "T",
                "expected_seq": 0,
                "kind": kind,
                "payload": payload,
            }
            args.update(change)
            r = producer.advance("T-1", args.pop("flow_id"), **args)
            assert (r.status, r.seq) == ("conflict", 1), change
        assert producer.flow("U") is None
        assert [e.event_id for e in producer.outbox("T")] == ["T-1", "T-2", "T-3"]


# -- the consumer side --------------------------------------------------------------


def test_reverse_arrival_gaps_until_complete_then_applies_in_order(at: At) -> None:
    with opened(at) as (producer, consumer):
        advance_all(producer, HAPPY)
        for seq in range(5, 1, -1):
            assert relay(producer, consumer, event_id=f"T-{seq}").status == "accepted"
            d = consumer.drain("T")
            assert (d.applied, d.stop) == (0, "gap")
            assert d.last is not None and d.last.seq == 1
            assert consumer.projection("T") is None
        assert relay(producer, consumer, event_id="T-1").status == "accepted"
        assert relay(producer, consumer).status == "idle"
        d = consumer.drain("T")
        assert (d.applied, d.stop) == (5, "idle")
        assert [e.seq for e in consumer.applied("T")] == [1, 2, 3, 4, 5]
        assert consumer.projection("T") == {
            "state": "answered",
            "last_seq": 5,
            "tool_calls": 2,
            "answered": True,
        }


def test_schema_2_tool_call_blocks_until_the_consumer_is_upgraded(at: At) -> None:
    with opened(at) as (producer, consumer):
        advance_all(producer, HAPPY[:2])
        advance_all(
            producer, [("tool_called", {"tool_name": "browser", "call": 1})], schema=2, start=2
        )
        assert producer.flow("T")["last_tool"] == "browser"  # type: ignore[index]
        advance_all(producer, HAPPY[3:], start=3)
        assert producer.flow("T")["tool_calls"] == 2  # type: ignore[index]
        # Every event is accepted, including the one this consumer cannot decode yet.
        assert [str(r.status) for r in relay_until_idle(producer, consumer)] == ["accepted"] * 5

        d = consumer.drain("T")
        assert (d.applied, d.stop) == (2, "blocked")
        assert d.last is not None
        assert (d.last.seq, d.last.event_id, d.last.reason) == (3, "T-3", "unsupported_schema")
        assert consumer.apply_next("T").reason == "unsupported_schema"  # re-examined, still blocked
        assert [(row.state, row.reason) for row in consumer.inbox("T")] == [
            ("applied", None),
            ("applied", None),
            ("blocked", "unsupported_schema"),
            ("pending", None),
            ("pending", None),
        ]
        assert consumer.process_all()["T"].stop == "blocked"
    with Consumer(at("consumer"), AGENT_TASK, schemas={1, 2}) as upgraded:
        d = upgraded.drain("T")
        assert (d.applied, d.stop) == (3, "idle")
        assert upgraded.projection("T") == {
            "state": "answered",
            "last_seq": 5,
            "tool_calls": 2,
            "answered": True,
        }
        assert [e.event_id for e in upgraded.applied("T")] == [f"T-{seq}" for seq in range(1, 6)]
        assert {row.state for row in upgraded.inbox("T")} == {"applied"}


@pytest.mark.parametrize(
    "prefix, bad, reason",
    [
        ([], envelope("X-1", "X", 1, kind="requested", payload={"prompt": ""}), "invalid_payload"),
        ([], envelope("X-1", "X", 1, kind="requested", payload={"question": "hi"}), "invalid_payload"),
        ([], envelope("X-1", "X", 1, kind="answered", payload={"answer": "42"}), "invalid_transition"),
        (
            [
                envelope("X-1", "X", 1, kind="requested", payload={"prompt": "p"}),
                envelope("X-2", "X", 2, kind="planned", payload={"steps": 1}),
            ],
            envelope("X-3", "X", 3, kind="tool_called", payload={"tool": "shell", "call": 1}),
            "invalid_payload",
        ),
        (
            [
                envelope("X-1", "X", 1, kind="requested", payload={"prompt": "p"}),
                envelope("X-2", "X", 2, kind="planned", payload={"steps": 1}),
            ],
            envelope("X-3", "X", 3, kind="tool_called", payload={"tool": "search", "call": 2}),
            "invalid_payload",
        ),
        (
            [
                envelope("X-1", "X", 1, kind="requested", payload={"prompt": "p"}),
                envelope("X-2", "X", 2, kind="planned", payload={"steps": 1}),
                envelope("X-3", "X", 3, kind="tool_called", payload={"tool": "search", "call": 1}),
            ],
            envelope("X-4", "X", 4, kind="tool_called", payload={"tool": "search", "call": 2}),
            "invalid_payload",
        ),
        (
            [envelope("X-1", "X", 1, kind="requested", payload={"prompt": "p"})],
            envelope("X-2", "X", 2, kind="planned", payload={"steps": 2}, schema=7),
            "unsupported_schema",
        ),
    ],
    ids=[
        "empty-prompt",
        "wrong-key",
        "answered-first",
        "bad-tool",
        "call-skips",
        "beyond-plan",
        "unknown-schema",
    ],
)
def test_hand_built_bad_event_is_accepted_then_blocks(
    at: At, prefix: list[dict[str, Any]], bad: dict[str, Any], reason: str
) -> None:
    with Consumer(at("consumer"), AGENT_TASK) as consumer:
        for event in prefix:
            assert consumer.receive(event).status == "accepted"
        assert consumer.drain("X").applied == len(prefix)
        assert consumer.receive(bad).status == "accepted"  # the inbox stores what it was given
        r = consumer.apply_next("X")
        assert (r.status, r.seq, r.event_id, r.reason) == (
            "blocked",
            bad["seq"],
            bad["event_id"],
            reason,
        )
        assert consumer.inbox("X")[-1] == InboxEntry(event_id=bad["event_id"], seq=bad["seq"], state="blocked", reason=reason)
        assert len(consumer.applied("X")) == len(prefix)
        projection = consumer.projection("X")
        assert (projection or {}).get("last_seq", 0) == len(prefix)


def test_example_main_runs_the_lifecycle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert agent_tasks.main([str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert (
        "projection T1: {'state': 'answered', 'last_seq': 5, 'answered': True, 'tool_calls': 2}"
        in out
    )
    assert "advance T1-6 failed      -> invalid_transition" in out


# -- a known library bug, kept visible --------------------------------------------


def test_protocol_data_cannot_masquerade_as_state_or_seq(at: At) -> None:
    # A step() whose data uses the library's own keys is a protocol bug: the
    # advance raises (and rolls back) instead of letting data shadow state/seq.
    shadow = Protocol(
        name="shadow",
        initial="new",
        transitions={"new": ["open"]},
        schemas={1: exact({"state": text(), "seq": integer(0, 99), "last_seq": integer(0, 99)})},
    )
    with opened(at, shadow) as (producer, _consumer):
        payload = {"state": "closed", "seq": 42, "last_seq": 42}
        with pytest.raises(ValueError, match="reserved keys"):
            producer.advance("S1", "S", expected_seq=0, kind="open", payload=payload)
        assert producer.flow("S") is None
        assert producer.outbox("S") == []


# -- contract tests: the same rules for every protocol ------------------------------

THREE_STEPS: dict[str, tuple[Protocol, Steps]] = {
    "reservation": (
        RESERVATION,
        [
            ("reserved", {"amount": 3}),
            ("confirmed", {"amount": 3}),
            ("released", {"amount": 3}),
        ],
    ),
    "agent_task": (
        AGENT_TASK,
        [
            ("requested", {"prompt": "p"}),
            ("planned", {"steps": 1}),
            ("tool_called", {"tool": "search", "call": 1}),
        ],
    ),
}
protocols = pytest.mark.parametrize(
    "protocol, steps", list(THREE_STEPS.values()), ids=list(THREE_STEPS)
)


@protocols
def test_duplicate_never_adds_effect(at: At, protocol: Protocol, steps: Steps) -> None:
    with opened(at, protocol) as (producer, consumer):
        advance_all(producer, steps, flow_id="F")
        assert relay(producer, consumer, event_id="F-1").status == "accepted"
        assert relay(producer, consumer, event_id="F-1").status == "duplicate"  # before apply
        assert [str(r.status) for r in relay_until_idle(producer, consumer)] == ["accepted", "accepted"]
        assert consumer.drain("F").applied == 3
        first = consumer.applied("F")
        for seq, (kind, payload) in enumerate(steps, start=1):
            event_id = f"F-{seq}"
            assert relay(producer, consumer, event_id=event_id).status == "duplicate"  # after apply
            assert consumer.receive(producer.event(event_id)).status == "duplicate"  # type: ignore[arg-type]
            assert (
                producer.advance(
                    event_id, "F", expected_seq=seq - 1, kind=kind, payload=payload
                ).status
                == "existing"
            )
        assert (consumer.drain("F").applied, consumer.process_all()) == (0, {})
        assert consumer.applied("F") == first
        assert [e.event_id for e in first] == ["F-1", "F-2", "F-3"]


@protocols
def test_arrival_orders_converge(at: At, protocol: Protocol, steps: Steps) -> None:
    outcomes = []
    with Producer(at("producer"), protocol) as producer:
        advance_all(producer, steps, flow_id="F")
        for n, order in enumerate(itertools.permutations([1, 2, 3])):
            with Consumer(at(f"consumer-{n}"), protocol, name=f"c{n}") as consumer:
                for seq in order:
                    assert relay(producer, consumer, event_id=f"F-{seq}", register=True).status == "accepted"
                    consumer.process_all()
                    applied = [e.seq for e in consumer.applied("F")]
                    assert applied == list(range(1, len(applied) + 1))  # always a gap-free prefix
                outcomes.append((consumer.projection("F"), consumer.applied("F")))
    assert len(outcomes) == 6
    assert all(outcome == outcomes[0] for outcome in outcomes)
    projection, effects = outcomes[0]
    assert projection is not None and (projection["state"], projection["last_seq"]) == (
        steps[-1][0],
        3,
    )
    assert [(e.seq, e.kind) for e in effects] == [
        (seq, kind) for seq, (kind, _) in enumerate(steps, 1)
    ]


@protocols
def test_skipping_a_step_commits_nothing(at: At, protocol: Protocol, steps: Steps) -> None:
    with opened(at, protocol) as (producer, _):
        kind, payload = steps[1]
        r = producer.advance("F-1", "F", expected_seq=0, kind=kind, payload=payload)
        assert r.status == "invalid_transition"
        assert (producer.flow("F"), producer.outbox("F")) == (None, [])
