"""Scenarios of arrival order: events applied in seq order whatever order they arrive in.

Event 3 before 1 (delivered by a real child process) before 2; a naive
consumer that deduplicates by id and still gets the order wrong; a gap in
one flow that does not hold up another; and all six arrival orders of one
flow ending in the same state.
"""

from __future__ import annotations

import itertools
import json

from ..._relay import relay
from .harness import (
    CHILD_TIMEOUT,
    Files,
    Result,
    advance_flow,
    create_files,
    deliver_on_signal,
    drain_dict,
    event_of,
    inbox_of,
    join_all,
    open_files,
    outbox_of,
    receive_answer,
    spawn,
)
from .wrong_ways import NaiveLastWriteConsumer

__all__ = ["arrival_3_1_2", "arrival_all_permutations", "flow_isolation", "naive_consumer"]


# -- the seed's ----------------------------------------------------------------------


def arrival_3_1_2(files: Files) -> Result:
    """Event 3 arrives, then 1 (from a real child held by an Event), then 2."""
    create_files(files)
    ctx = spawn()
    ready, go = ctx.Event(), ctx.Event()
    reader, writer = ctx.Pipe(duplex=False)
    child = ctx.Process(
        target=deliver_on_signal,
        args=(files.producer, files.consumer, "A1", ready, go, writer),
        name="reliable_flow-arrival-child",
    )
    with open_files(files) as (producer, consumer):
        advance_flow(producer, "A")
        child.start()
        writer.close()
        try:
            child_ready = ready.wait(CHILD_TIMEOUT)
            stages = []

            def stage(event_id: str, by: str, status: str) -> None:
                drained = consumer.drain("A")
                stages.append(
                    {
                        "delivered": event_id,
                        "by": by,
                        "relay": status,
                        "drain": drain_dict(drained),
                        "applied_prefix": [e.seq for e in consumer.applied("A")],
                    }
                )

            stage("A3", "parent", str(relay(producer, consumer, event_id="A3").status))
            go.set()
            child_status = receive_answer(reader)
        finally:
            go.set()  # never leave the child waiting, whatever happened above
            reader.close()
            (child_exit,) = join_all([child])
        stage("A1", "child process", str(child_status))
        stage("A2", "parent", str(relay(producer, consumer, event_id="A2").status))
        return {
            "child_was_ready_before_3": child_ready,
            "child_exit_code": child_exit,
            "stages": stages,
            "projection": consumer.projection("A"),
            "effect_kinds": [e.kind for e in consumer.applied("A")],
            "inbox_states": [row["state"] for row in inbox_of(consumer, "A")],
        }


def naive_consumer(files: Files) -> Result:
    """An id-only-dedup consumer that overwrites by arrival order, against ours, on 3,1,2,3."""
    arrivals = ["A3", "A1", "A2", "A3"]
    with open_files(files) as (producer, consumer):
        advance_flow(producer, "A")
        events = {eid: event_of(producer, eid) for eid in ("A1", "A2", "A3")}
        with NaiveLastWriteConsumer(str(files.dir / "naive.db")) as naive:
            naive_answers = [naive.receive(events[eid]) for eid in arrivals]
            naive_state = naive.state("A")
        ours = []
        for eid in arrivals:
            status = str(relay(producer, consumer, event_id=eid).status)
            ours.append({"event": eid, "relay": status, "drain": drain_dict(consumer.drain("A"))})
        return {
            "arrivals": arrivals,
            "naive": {"answers": naive_answers, "final": naive_state},
            "reliable_flow": {
                "steps": ours,
                "final": consumer.projection("A"),
                "effect_kinds": [e.kind for e in consumer.applied("A")],
            },
        }


def flow_isolation(files: Files) -> Result:
    """A gets 1 and 3 (gap at 2), B gets 1, 2, 3: process_all moves B to the end, A stays."""
    with open_files(files) as (producer, consumer):
        advance_flow(producer, "A")
        advance_flow(producer, "B")
        delivered = {
            eid: str(relay(producer, consumer, event_id=eid).status)
            for eid in ("A1", "A3", "B1", "B2", "B3")
        }
        drained = {flow: drain_dict(d) for flow, d in consumer.process_all().items()}
        return {
            "delivered": delivered,
            "process_all": drained,
            "projection_A": consumer.projection("A"),
            "projection_B": consumer.projection("B"),
            "outbox_A": outbox_of(producer, "A"),
            "inbox_A": inbox_of(consumer, "A"),
        }


# -- ours ----------------------------------------------------------------------------


def arrival_all_permutations(files: Files) -> Result:
    """All six arrival orders of A1..A3, relay + drain after each: one end state, one order."""
    finals = {}
    for order in itertools.permutations(("A1", "A2", "A3")):
        sub = Files(files.dir / "-".join(order))
        sub.dir.mkdir()
        with open_files(sub) as (producer, consumer):
            advance_flow(producer, "A")
            for eid in order:
                relay(producer, consumer, event_id=eid)
                consumer.drain("A")
            finals[",".join(order)] = {
                "projection": consumer.projection("A"),
                "effect_kinds": [e.kind for e in consumer.applied("A")],
            }
    distinct = {json.dumps(v, sort_keys=True) for v in finals.values()}
    return {"per_order": finals, "all_orders_end_the_same": len(distinct) == 1}
