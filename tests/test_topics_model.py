"""A model of partial subscriptions against a reference (issue 32), on both engines.

Hypothesis draws a producer's history (two flows, interleaved, of kinds in
several topics), a consumer's subscription, and what the network does to
its deliveries: arrivals permuted, duplicated, some lost.  The reference is
the obvious one: the consumer's events are those of a kind one of its
topics carries, in each flow's order.  After every arrival:

* every event for the consumer is stored once and applied at most once,
  and the applied ones are exactly the longest prefix of its events (per
  flow) that has arrived: it never waits for an event not for it;
* when a later event of its own arrived, the flow reports a gap naming an
  event for it that is missing: the one just before the first that arrived
  (the one that delivery names);
* once the lost ones are delivered again, every event for it is applied
  exactly once, in the flow's order.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_reads import new_location
from reliable_flow import Consumer, Producer, Topic
from test_topics import AGENT, KINDS, WHO, topics

_LABELS = itertools.count()
TOPIC_NAMES = [t.name for t in topics()]
CARRIES = {t.name: t.kinds for t in topics()}

history = st.lists(st.tuples(st.sampled_from(["A", "B"]), st.sampled_from(KINDS)), min_size=1, max_size=14)
subscription = st.sets(st.sampled_from(TOPIC_NAMES), min_size=1).filter(lambda s: s != set(TOPIC_NAMES))


def _for_it(kind: str, subscribed: set[str]) -> bool:
    return any(kind in CARRIES[t] for t in subscribed)


def _check(consumer: Consumer, events: dict[str, list[tuple[int, str]]], arrived: set[str]) -> None:
    """The invariants after an arrival (see the module docstring)."""
    for flow, mine in events.items():
        prefix = list(itertools.takewhile(lambda e: e[1] in arrived, mine))
        applied = [(a.seq, a.event_id) for a in consumer.applied(flow)]
        assert applied == prefix, (flow, applied, prefix)  # once each, in order, no wait on another's
        rest = mine[len(prefix):]
        later = [i for i, e in enumerate(rest) if e[1] in arrived]
        answer = consumer.apply_next(flow)  # nothing left to apply: answers without writing
        if later:
            # The event for it just before the first one that arrived: missing,
            # and the one its delivery names (earlier ones it cannot know of).
            wanted = rest[later[0] - 1][0]
            assert (answer.status, answer.seq) == ("gap", wanted), (flow, answer, rest)
            assert consumer.stuck(flow).detail == f"seq {wanted} has not arrived"
        else:
            assert answer.status == "idle", answer


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=history, subscribed=subscription, data=st.data())
def test_a_partial_subscriber_matches_the_reference(engine: str, tmp_path: Path, steps: list[tuple[str, str]],
                                                    subscribed: set[str], data: Any) -> None:
    n = next(_LABELS)
    with Producer(new_location(engine, tmp_path, f"p{n}"), AGENT, topics=topics()) as p, \
            Consumer(new_location(engine, tmp_path, f"c{n}"), AGENT, name="sub") as c:
        p.admin.register_consumer("sub", topics=sorted(subscribed), **WHO)
        seqs: dict[str, int] = {"A": 0, "B": 0}
        events: dict[str, list[tuple[int, str]]] = {"A": [], "B": []}
        for i, (flow, kind) in enumerate(steps):
            event_id = f"{flow}-{i}"
            assert p.advance(event_id, flow, expected_seq=seqs[flow], kind=kind, payload={}).status == "committed"
            seqs[flow] += 1
            if _for_it(kind, subscribed):
                events[flow].append((seqs[flow], event_id))
        bodies = {json.loads(b)["event_id"]: b for _, b in p.store.latest.next_due("sub", float("inf"), 1000)}
        assert sorted(bodies) == sorted(e for mine in events.values() for _, e in mine)  # routing = reference
        ids = sorted(bodies)
        lost = data.draw(st.sets(st.sampled_from(ids)) if ids else st.just(set()), label="lost")
        kept = [i for i in ids if i not in lost]
        again = data.draw(st.lists(st.sampled_from(kept), max_size=4) if kept else st.just([]), label="duplicated")
        arrivals = data.draw(st.permutations(kept + again), label="arrivals")
        arrived: set[str] = set()
        for event_id in arrivals:
            status = c.accept(bodies[event_id]).status
            assert status == ("duplicate" if event_id in arrived else "accepted"), (event_id, status)
            arrived.add(event_id)
            c.process_all()
            _check(c, events, arrived)
        for event_id in sorted(lost):  # delivered again
            assert c.accept(bodies[event_id]).status == "accepted"
            arrived.add(event_id)
        c.process_all()
        _check(c, events, arrived)
        for flow, mine in events.items():
            assert [(a.seq, a.event_id) for a in c.applied(flow)] == mine
            assert (c.projection(flow) or {"last_seq": 0})["last_seq"] == (mine[-1][0] if mine else 0)


def test_the_model_can_fail_a_topic_carries_what_it_declares() -> None:
    """The reference the model trusts: each topic's kinds as declared."""
    assert all(isinstance(t, Topic) and t.kinds for t in topics())
    assert CARRIES["agent.audit"] == frozenset(KINDS)
