"""The child-process side of the batch crash tests in ``test_batch.py``.

Not collected by pytest (no ``test_`` prefix).  Run as a script, in a fresh
interpreter started by the test with an explicit environment (including
``RELIABLE_FLOW_CRASH_AT``) and a timeout::

    python tests/children/batch_child.py advance-batch PRODUCER
    python tests/children/batch_child.py relay-batch PRODUCER CONSUMER
    python tests/children/batch_child.py drain PROTOCOL CONSUMER FLOW BATCH_SIZE
    python tests/children/batch_child.py process-all PROTOCOL CONSUMER BATCH_SIZE

Without a crash point the child runs to the end and prints what the batch
call answered as one JSON line, so the control run can check that the path
really went through the batch API.  The test imports this module for the
fixed batch (:data:`ADVANCE_BATCH`) and the long-flow protocol
(:data:`TICKER`), so parent and child agree on both.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from reliable_flow import Consumer, Producer, relay_batch
from reliable_flow.protocol import Protocol, exact, integer
from reliable_flow.reservation import RESERVATION


def _tick(state: str, kind: str, value: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    return {"n": value["n"], "steps": data.get("steps", 0) + 1}


def _show(state: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"n": data["n"], "steps": data["steps"]}


# A protocol whose flows can be long (running -> running -> ...), so one flow
# spans several apply batches.  ``steps`` in the projection counts applies.
TICKER = Protocol(
    name="ticker",
    initial="idle",
    transitions={"idle": ["running"], "running": ["running", "done"]},
    schemas={
        1: exact({"n": integer(1, 1_000_000)}),
        2: exact({"count": integer(1, 1_000_000)}, rename={"count": "n"}),
    },
    step=_tick,
    project=_show,
    consumer_schemas={1},
)

PROTOCOLS = {"reservation": RESERVATION, "ticker": TICKER}

# Run against a producer file that already holds Z1 (committed by the parent):
# two advances that write nothing, then four that commit, across three flows.
ADVANCE_BATCH: tuple[dict[str, Any], ...] = (
    {"event_id": "Z1", "flow_id": "Z", "expected_seq": 0, "kind": "reserved", "payload": {"amount": 9}},
    {"event_id": "Z1-late", "flow_id": "Z", "expected_seq": 0, "kind": "reserved", "payload": {"amount": 9}},
    {"event_id": "A1", "flow_id": "A", "expected_seq": 0, "kind": "reserved", "payload": {"amount": 3}},
    {"event_id": "B1", "flow_id": "B", "expected_seq": 0, "kind": "reserved", "payload": {"units": 5},
     "schema": 2},
    {"event_id": "A2", "flow_id": "A", "expected_seq": 1, "kind": "confirmed", "payload": {"amount": 3}},
    {"event_id": "C1", "flow_id": "C", "expected_seq": 0, "kind": "reserved", "payload": {"amount": 7}},
)
ADVANCE_BATCH_PRE = ADVANCE_BATCH[0]  # committed by the parent before the child runs


def advance_batch(producer_path: str) -> list[str]:
    with Producer(producer_path, RESERVATION) as producer:
        with producer.batch() as b:
            for call in ADVANCE_BATCH:
                b.advance(**call)
        return [str(r.status) for r in b.results]


def relay_batch_once(producer_path: str, consumer_path: str) -> list[str]:
    with Producer(producer_path, RESERVATION) as producer, Consumer(consumer_path, RESERVATION) as consumer:
        result = relay_batch(producer, consumer, limit=100)
        return [str(r.status) for r in result.results]


def drain(protocol: str, consumer_path: str, flow_id: str, batch_size: str) -> list[Any]:
    with Consumer(consumer_path, PROTOCOLS[protocol]) as consumer:
        result = consumer.drain(flow_id, limit=1000, batch_size=int(batch_size))
        return [result.applied, str(result.stop)]


def process_all(protocol: str, consumer_path: str, batch_size: str) -> dict[str, Any]:
    with Consumer(consumer_path, PROTOCOLS[protocol]) as consumer:
        results = consumer.process_all(limit=1000, batch_size=int(batch_size))
        return {flow: [r.applied, str(r.stop)] for flow, r in results.items()}


COMMANDS: dict[str, Callable[..., Any]] = {
    "advance-batch": advance_batch,
    "relay-batch": relay_batch_once,
    "drain": drain,
    "process-all": process_all,
}


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] not in COMMANDS:
        print(f"usage: {argv[0]} {{{','.join(COMMANDS)}}} ARGS...", file=sys.stderr)
        return 2
    out = COMMANDS[argv[1]](*argv[2:])
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
