"""An agent task lifecycle, written as a reliable_flow protocol in user code.

    new -> requested -> planned -> tool_called (again and again) -> answered
                 \\           \\              \\
                  +-----------+--------------+--> failed

Each step's ``kind`` is the state it leads to; its payload depends on the kind:

    requested    {"prompt": text, 1..2000 chars}
    planned      {"steps": int 1..20}
    tool_called  {"tool": "search" | "calculator" | "browser", "call": int}
    answered     {"answer": text, 1..4000 chars}
    failed       {"error": text}

``call`` must be the previous call number + 1 and may not exceed the planned
``steps``; those rules depend on history, so they live in ``_step``.  Schema 2
spells ``tool`` as ``tool_name``; it decodes to the same shape, so the rest of
the protocol does not change.  Consumers decode schema 1 unless opened with
``schemas={1, 2}``.

Run ``python examples/agent_tasks.py [DIR]`` for a short end-to-end run.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from reliable_flow import Consumer, Producer, relay
from reliable_flow.protocol import PayloadError, Protocol, by_kind, exact, integer, text

__all__ = ["AGENT_TASK", "TOOLS", "main"]

TOOLS = ("search", "calculator", "browser")
MAX_STEPS = 20

_SCHEMA_1 = {
    "requested": exact({"prompt": text(1, 2000)}),
    "planned": exact({"steps": integer(1, MAX_STEPS)}),
    "tool_called": exact({"tool": text(choices=TOOLS), "call": integer(1, MAX_STEPS)}),
    "answered": exact({"answer": text(1, 4000)}),
    "failed": exact({"error": text()}),
}
# Schema 2 changes one field's name; every other kind is read as in schema 1.
_SCHEMA_2 = {
    **_SCHEMA_1,
    "tool_called": exact(
        {"tool_name": text(choices=TOOLS), "call": integer(1, MAX_STEPS)},
        rename={"tool_name": "tool"},
    ),
}


def _step(state: str, kind: str, value: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """The task's data after a legal step; raises PayloadError for history rules."""
    if kind == "requested":
        return {"tool_calls": 0}
    if kind == "planned":
        return {**data, "steps": value["steps"]}
    if kind == "tool_called":
        expected = data["tool_calls"] + 1
        if value["call"] != expected:
            raise PayloadError("call", f"must be {expected} (the next call), got {value['call']}")
        if value["call"] > data["steps"]:
            raise PayloadError("call", f"exceeds the {data['steps']} planned steps")
        return {**data, "tool_calls": value["call"], "last_tool": value["tool"]}
    if kind == "failed":
        return {**data, "error": value["error"]}
    return dict(data)  # answered: the answer itself stays in the event


def _project(state: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": data.get("tool_calls", 0), "answered": state == "answered"}


AGENT_TASK = Protocol(
    name="agent_task",
    initial="new",
    transitions={
        "new": ["requested"],
        "requested": ["planned", "failed"],
        "planned": ["tool_called", "failed"],
        "tool_called": ["tool_called", "answered", "failed"],
    },
    schemas={1: by_kind(_SCHEMA_1), 2: by_kind(_SCHEMA_2)},
    step=_step,
    project=_project,
    consumer_schemas={1},
)

LIFECYCLE = [
    ("requested", {"prompt": "What is 6 times 7, and who first asked?"}),
    ("planned", {"steps": 2}),
    ("tool_called", {"tool": "calculator", "call": 1}),
    ("tool_called", {"tool": "search", "call": 2}),
    ("answered", {"answer": "42; Douglas Adams asked first."}),
]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    with tempfile.TemporaryDirectory(prefix="agent_tasks_") as tmp:
        where = Path(args[0] if args else tmp)
        where.mkdir(parents=True, exist_ok=True)
        with (
            Producer(where / "agent.db", AGENT_TASK) as producer,
            Consumer(where / "observer.db", AGENT_TASK) as consumer,
        ):
            for seq, (kind, payload) in enumerate(LIFECYCLE):
                event_id = f"T1-{seq + 1}"
                r = producer.advance(event_id, "T1", expected_seq=seq, kind=kind, payload=payload)
                print(f"advance {event_id} {kind:<11} -> {r.status}")
            late = producer.advance(
                "T1-6", "T1", expected_seq=5, kind="failed", payload={"error": "too late"}
            )
            print(f"advance T1-6 failed      -> {late.status} (answered is final)")
            while (sent := relay(producer, consumer)).status != "idle":
                print(f"relay {sent.event_id} -> {sent.status}")
            for flow_id, result in consumer.process_all().items():
                print(f"process_all: {flow_id} applied {result.applied}, stopped at {result.stop}")
            print(f"projection T1: {consumer.projection('T1')}")
            print("effects T1:", ", ".join(e.kind for e in consumer.applied("T1")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
